"""The ``light`` transport: kubeconfig / in-cluster credentials over :mod:`fleet.kube.http`.

Supported credentials: bearer ``token``, ``tokenFile`` (re-read when it changes, as
the kubelet rotates projected tokens), client certificates (file or ``-data``), basic
``username``/``password``; cluster CA (file or ``-data``), ``insecure-skip-tls-verify``,
``tls-server-name``. Anything else (``exec``, ``auth-provider``, proxies) is refused
with an error naming it: use the ``generated`` transport for those. A CA together with
``insecure-skip-tls-verify`` is refused (as client-go does): it would silently turn
verification off. Kubeconfigs from Secrets are checked further
(:mod:`fleet.kube.inline`). Key material is never written to disk: a client key pair is
loaded from anonymous memory (``memfd_create``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import ssl
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio

from fleet.kube.errors import (
    KubeError,
    UnreachableError,
    WatchIdleError,
    answer,
    from_status,
)
from fleet.kube.http import ConnectSlots, HttpClient, HttpError, Response

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_RECHECK_SECONDS = 10.0


class KubeconfigError(KubeError):
    """A kubeconfig (or in-cluster environment) the light transport cannot use."""


class NeedsGeneratedTransportError(KubeconfigError):
    """A valid kubeconfig with a feature only the ``generated`` transport has."""


@dataclass(frozen=True, slots=True)
class Credentials:
    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    token: str | None = None
    token_file: Path | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    basic: tuple[str, str] | None = None


def _named(items: Any, name: str, what: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            value = item.get(what)
            return dict(value) if isinstance(value, Mapping) else {}
    raise KubeconfigError(f"kubeconfig: no {what} named {name!r}")


def _data_or_file(section: Mapping[str, Any], key: str, base: Path | None) -> bytes | None:
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            raise KubeconfigError(f"kubeconfig: {key}-data is not base64") from None
    path = section.get(key)
    if path:
        p = Path(path)
        if not p.is_absolute() and base is not None:
            p = base / p
        try:
            return p.read_bytes()
        except OSError as e:
            raise KubeconfigError(f"kubeconfig: {key} {p}: {e.strerror or e}") from None
    return None


def credentials_from_kubeconfig(kubeconfig: Mapping[str, Any], *, context: str | None = None,
                                base_dir: Path | None = None) -> Credentials:
    ctx_name = context or kubeconfig.get("current-context")
    if not ctx_name:
        raise KubeconfigError("kubeconfig: no context given and no current-context")
    ctx = _named(kubeconfig.get("contexts"), str(ctx_name), "context")
    cluster = _named(kubeconfig.get("clusters"), str(ctx.get("cluster")), "cluster")
    user = _named(kubeconfig.get("users"), str(ctx.get("user")), "user") \
        if ctx.get("user") else {}
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported):
            raise NeedsGeneratedTransportError(
                f"kubeconfig user {ctx.get('user')!r}: {unsupported} credentials need the "
                "'generated' transport")
    if cluster.get("proxy-url"):
        raise NeedsGeneratedTransportError("kubeconfig: proxy-url needs the 'generated' "
                                           "transport")
    insecure = cluster.get("insecure-skip-tls-verify")
    if insecure is not None and not isinstance(insecure, bool):
        raise KubeconfigError(f"kubeconfig cluster {ctx.get('cluster')!r}: "
                              "insecure-skip-tls-verify is not a boolean")
    if insecure and (cluster.get("certificate-authority-data")
                     or cluster.get("certificate-authority")):
        # client-go: "specifying a root certificates file with the insecure flag is not
        # allowed"; taking the flag would silently drop the CA's verification.
        raise KubeconfigError(f"kubeconfig cluster {ctx.get('cluster')!r}: "
                              "insecure-skip-tls-verify together with a certificate "
                              "authority is not allowed")
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"kubeconfig cluster {ctx.get('cluster')!r} has no server")
    token_file = user.get("tokenFile")
    basic = (str(user["username"]), str(user.get("password") or "")) \
        if user.get("username") else None
    return Credentials(
        server=str(server),
        ca_pem=_data_or_file(cluster, "certificate-authority", base_dir),
        insecure=bool(insecure),
        tls_server_name=cluster.get("tls-server-name"),
        token=user.get("token"),
        token_file=(base_dir / token_file if base_dir and not Path(token_file).is_absolute()
                    else Path(token_file)) if token_file else None,
        cert_pem=_data_or_file(user, "client-certificate", base_dir),
        key_pem=_data_or_file(user, "client-key", base_dir),
        basic=basic,
    )


def in_cluster_credentials(sa_dir: Path = SA_DIR) -> Credentials:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), \
        os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeconfigError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set "
                              "(pass --kubeconfig)")
    host = f"[{host}]" if ":" in host else host
    try:
        ca = (sa_dir / "ca.crt").read_bytes()
    except OSError as e:
        raise KubeconfigError(f"in-cluster CA {sa_dir / 'ca.crt'}: {e.strerror or e}") from None
    return Credentials(server=f"https://{host}:{port}", ca_pem=ca,
                       token_file=sa_dir / "token")


# One SSL context per (CA bundle, client certificate, verification) in use: clients with
# the same trust and identity share it (a context with its loaded CA store costs more than
# a connection). Weak values: a context goes with the last client using it, so rotated
# credentials leave nothing behind.
_contexts: weakref.WeakValueDictionary[str, ssl.SSLContext] = weakref.WeakValueDictionary()


def _context_key(creds: Credentials) -> str:
    h = hashlib.sha256()
    for part in (b"insecure" if creds.insecure else b"verify", creds.ca_pem or b"-",
                 creds.cert_pem or b"-", creds.key_pem or b"-"):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _ssl_context(creds: Credentials) -> ssl.SSLContext:
    """The shared context for these credentials (see ``_contexts``)."""
    key = _context_key(creds)
    ctx = _contexts.get(key)
    if ctx is None:
        ctx = _new_ssl_context(creds)
        _contexts[key] = ctx
    return ctx


def _new_ssl_context(creds: Credentials) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if creds.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif creds.ca_pem:
        try:
            ctx.load_verify_locations(cadata=creds.ca_pem.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError) as e:
            raise KubeconfigError(f"cluster CA is not a PEM certificate: {e}") from None
    else:
        ctx.load_default_certs()
    if creds.cert_pem and creds.key_pem:
        _load_key_pair(ctx, creds.cert_pem, creds.key_pem)
    elif creds.cert_pem or creds.key_pem:
        raise KubeconfigError("kubeconfig user has a client certificate or key, not both")
    return ctx


def _load_key_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """``ctx.load_cert_chain`` from memory: ssl reads key pairs from files only, so the
    pair goes into an anonymous memory file (memfd_create: no name on any file system,
    gone when closed, which is right after loading) read through /proc/self/fd. Never a
    file on disk: where memfd_create is missing, a clear error."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        raise KubeconfigError("a client certificate needs os.memfd_create (Linux) to load "
                              "the key without writing it to disk; it is not available here")
    try:
        fd = memfd_create("k0s-fleet-client-key", os.MFD_CLOEXEC)
    except OSError as e:
        raise KubeconfigError(f"client certificate: memfd_create: {e.strerror or e}") from None
    try:
        data = cert_pem.rstrip(b"\n") + b"\n" + key_pem
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        try:
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        except ssl.SSLError as e:
            raise KubeconfigError(f"client certificate/key unusable: {e}") from None
        except OSError as e:
            raise KubeconfigError(f"client certificate: reading it back from memory "
                                  f"(/proc/self/fd/{fd}): {e.strerror or e}") from None
    finally:
        os.close(fd)


class _Token:
    """A bearer token, from a file re-read when it changes (rotated projected tokens)."""

    def __init__(self, creds: Credentials) -> None:
        self.static = creds.token
        self.file = creds.token_file
        self._value: str | None = None
        self._checked = 0.0
        self._mtime = -1.0

    def get(self) -> str | None:
        if self.static:
            return self.static
        if self.file is None:
            return None
        now = time.monotonic()
        if self._value is None or now - self._checked >= TOKEN_RECHECK_SECONDS:
            self._checked = now
            try:
                mtime = self.file.stat().st_mtime
                if mtime != self._mtime or self._value is None:
                    self._value = self.file.read_text(encoding="utf-8").strip()
                    self._mtime = mtime
            except OSError as e:
                if self._value is None:
                    raise KubeconfigError(f"token file {self.file}: {e.strerror or e}") from None
        return self._value


class _Lines:
    def __init__(self, resp: Response, what: str) -> None:
        self._resp = resp
        self._what = what

    async def readline(self) -> bytes:
        try:
            return await self._resp.readline()
        except TimeoutError as e:
            raise WatchIdleError(f"{self._what}: nothing read: {e!r}") from e
        except HttpError as e:
            raise UnreachableError(f"{self._what}: {e!r}") from e

    async def pour(self, sink: Callable[[bytes], None]) -> None:
        try:
            await self._resp.pour(sink)
        except TimeoutError as e:
            raise WatchIdleError(f"{self._what}: nothing read: {e!r}") from e
        except HttpError as e:
            raise UnreachableError(f"{self._what}: {e!r}") from e

    def release(self) -> None:
        self._resp.release()


class LightTransport:
    def __init__(self, creds: Credentials, *, name: str,
                 connect_slots: ConnectSlots | None = None) -> None:
        """``connect_slots``: shared by many clients (the controller's workload clusters),
        bounds how many connections they open at once."""
        self.name = name
        self._creds = creds
        self._token = _Token(creds)
        self._http = HttpClient(creds.server, ssl_context=_ssl_context(creds)
                                if creds.server.startswith("https") else None,
                                server_hostname=creds.tls_server_name,
                                connect_slots=connect_slots)
        if creds.basic is not None:
            raw = f"{creds.basic[0]}:{creds.basic[1]}".encode()
            self._basic: str | None = f"Basic {base64.b64encode(raw).decode()}"
        else:
            self._basic = None

    @property
    def host(self) -> str:
        return self._creds.server

    def _headers(self, extra: Mapping[str, str]) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "k0s-fleet", **extra}
        token = self._token.get()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self._basic:
            headers["Authorization"] = self._basic
        return headers

    async def close(self) -> None:
        await self._http.close()

    async def call(self, method: str, path: str, *, query: Sequence[tuple[str, str]],
                   body: Any, content_type: str, timeout: float | None,
                   decode: Callable[[bytes], Any] | None = None) -> Any:
        target = f"{path}?{urlencode(list(query))}" if query else path
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        extra = {"Content-Type": content_type} if payload is not None else {}
        try:
            with anyio.fail_after(timeout):
                resp = await self._http.request(method, target, headers=self._headers(extra),
                                                body=payload, read_timeout=timeout)
                try:
                    data = await resp.read()
                finally:
                    resp.release()
        except (HttpError, TimeoutError) as e:
            raise UnreachableError(f"{self.name}: {method} {path}: {e!r}") from e
        return answer(f"{self.name}: {method} {path}", resp.status, data, resp.headers,
                      json.loads if decode is None else decode)

    async def stream(self, path: str, *, query: Sequence[tuple[str, str]],
                     read_timeout: float) -> _Lines:
        target = f"{path}?{urlencode(list(query))}" if query else path
        try:
            resp = await self._http.request("GET", target, headers=self._headers({}),
                                            read_timeout=read_timeout)
        except (HttpError, TimeoutError) as e:
            raise UnreachableError(f"{self.name}: watch {path}: {e!r}") from e
        if not 200 <= resp.status <= 299:
            try:
                data = await resp.read()
            except (HttpError, TimeoutError):
                data = b""
            resp.release()
            raise from_status(resp.status, data, resp.headers)
        return _Lines(resp, f"{self.name}: watch {path}")
