"""The real Cluster API core manager in the test world.

hack/testenv/build.sh builds the manager from the Go module proxy at the pinned versions
(``CAPI_VERSION``, ``CAPI_OLD_VERSION`` in hack/testenv/pins.env) and copies that
module's CRDs and webhook configurations into the cache. :class:`CapiManager` runs one
manager against one (management) API server of the test world:

1. :meth:`install_crds` installs every CRD of that CAPI version; CRDs serving more than
   one version get a conversion webhook pointing at the manager (``url`` + ``caBundle``);
2. :meth:`start` writes a serving certificate for 127.0.0.1 signed by a fresh test CA,
   starts the manager (admin kubeconfig, no leader election, webhooks, health and
   diagnostics on loopback ports, the requested feature gates) and waits for ``/readyz``
   (which includes "the webhook server is serving");
3. :meth:`install_webhooks` installs CAPI's mutating and validating webhook
   configurations rewritten from the in-cluster Service to that ``url`` + ``caBundle``.

Nothing here runs in production.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import logging
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import yaml

from fleet.kube import AlreadyExistsError, KubeClient
from fleet.kube.resources import Resource
from fleet.testing.binaries import binary, capi_data_dir, pins
from fleet.testing.world import (
    CHART_CRDS,
    TEST_CRDS,
    ApiServer,
    World,
    crd_documents,
    free_port,
    install_crds,
    kill_group,
    wait_tcp,
)

log = logging.getLogger(__name__)

MUTATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1",
                             "mutatingwebhookconfigurations",
                             "MutatingWebhookConfiguration", namespaced=False)
VALIDATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1",
                               "validatingwebhookconfigurations",
                               "ValidatingWebhookConfiguration", namespaced=False)
# The alpha gates CAPI's in-place update path needs (both off by default in v1.12-v1.14).
IN_PLACE_GATES: dict[str, bool] = {"RuntimeSDK": True, "InPlaceUpdates": True}


def capi_version() -> str:
    """The newest pinned Cluster API version (v1.14.x)."""
    return pins()["CAPI_VERSION"]


def capi_old_version() -> str:
    """The Cluster API version k0smotron v2.1 pins (v1.12.x)."""
    return pins()["CAPI_OLD_VERSION"]


def capi_versions() -> list[str]:
    return [capi_version(), capi_old_version()]


def capi_crd_documents(version: str) -> list[dict[str, Any]]:
    """Every CRD Cluster API ``version`` ships (core/config/crd/bases in its module)."""
    return crd_documents(capi_data_dir(version) / "crds")


def with_conversion_webhook(crd: dict[str, Any], url: str, ca_pem: bytes) -> dict[str, Any]:
    """``crd`` converting between its versions through the webhook at ``url``."""
    if len(crd["spec"]["versions"]) < 2:
        return crd
    out = copy.deepcopy(crd)
    out["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1", "v1beta1"],
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}}}
    return out


def webhook_configurations(version: str, base_url: str, ca_pem: bytes
                           ) -> list[dict[str, Any]]:
    """CAPI's webhook configurations, each webhook sent to ``base_url`` + its path."""
    path = capi_data_dir(version) / "webhook" / "manifests.yaml"
    out = []
    for loaded in yaml.safe_load_all(path.read_text()):
        if not loaded:
            continue
        doc = copy.deepcopy(loaded)
        doc["metadata"] = {"name": f"capi-{doc['metadata']['name']}"}
        for hook in doc.get("webhooks") or []:
            service = (hook.get("clientConfig") or {}).get("service") or {}
            hook["clientConfig"] = {"url": f"{base_url}{service.get('path', '/')}",
                                    "caBundle": base64.b64encode(ca_pem).decode()}
        out.append(doc)
    return out


def serving_certificate(directory: Path, days: int = 30) -> None:
    """A fresh test CA (``ca.crt``) and a serving certificate for 127.0.0.1 / localhost it
    signed (``tls.crt``, ``tls.key``), made with openssl."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", str(days),
        "-subj", "/CN=capi-webhook test CA")
    run("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=capi-webhook")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                       "extendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "tls.crt", "-days", str(days), "-extfile", "san.ext")
    (directory / "tls.key").chmod(0o600)


def _feature_gates(gates: dict[str, bool]) -> str:
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))


@dataclass
class CapiManager:
    """One real CAPI core manager reconciling the objects of ``server``."""

    server: ApiServer
    version: str
    workdir: Path
    feature_gates: dict[str, bool] = field(default_factory=dict)
    webhook_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    diagnostics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    ca_pem: bytes = b""
    startup_seconds: float = 0.0

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / "capi-manager.log"

    def _certificates(self) -> Path:
        certs = self.workdir / "webhook-certs"
        if not (certs / "tls.crt").exists():
            serving_certificate(certs)
        self.ca_pem = (certs / "ca.crt").read_bytes()
        return certs

    def command(self) -> list[str]:
        cmd = [
            str(binary(f"capi-manager-{self.version}")),
            "--leader-elect=false",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-cert-dir={self.workdir / 'webhook-certs'}",
            f"--health-addr=127.0.0.1:{self.health_port}",
            f"--diagnostics-address=127.0.0.1:{self.diagnostics_port}",
            "--insecure-diagnostics",
            "--v=2",
        ]
        if self.feature_gates:
            cmd.append(f"--feature-gates={_feature_gates(self.feature_gates)}")
        return cmd

    async def install_crds(self, client: KubeClient) -> None:
        """All CRDs of this CAPI version, converting through this manager's webhook."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._certificates()
        docs = [with_conversion_webhook(d, f"{self.webhook_url}/convert", self.ca_pem)
                for d in capi_crd_documents(self.version)]
        await install_crds(client, docs)

    async def install_webhooks(self, client: KubeClient) -> None:
        """CAPI's defaulting and validating webhooks, served by this manager."""
        for doc in webhook_configurations(self.version, self.webhook_url, self.ca_pem):
            res = MUTATING_WEBHOOKS if doc["kind"] == MUTATING_WEBHOOKS.kind \
                else VALIDATING_WEBHOOKS
            try:
                await client.create(res, doc)
            except AlreadyExistsError:
                current = await client.get(res, doc["metadata"]["name"])
                doc["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await client.replace(res, doc)

    def start(self, timeout: float = 120.0) -> None:
        """Start the manager and wait until it is ready (blocking)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._certificates()
        kubeconfig = self.server.write_kubeconfig(self.workdir / "kubeconfig.yaml")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        logf = open(self.log_file, "ab")  # noqa: SIM115
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        logf.close()
        try:
            wait_tcp(self.health_port, self.proc, f"CAPI manager {self.version}", timeout)
            self._wait_ready(t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0

    def _wait_ready(self, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"CAPI manager {self.version} exited "
                                   f"({self.proc.returncode}); see {self.log_file}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"CAPI manager {self.version} not ready; see {self.log_file}")

    def stop(self) -> None:
        kill_group(self.proc)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""


@dataclass
class CapiEnv:
    """A management API server of the test world with a real CAPI manager on it."""

    version: str
    server: ApiServer
    manager: CapiManager
    client: KubeClient

    @property
    def name(self) -> str:
        return self.server.name


async def start_capi_env(world: World, version: str, *,
                         feature_gates: dict[str, bool] | None = None,
                         name: str | None = None) -> CapiEnv:
    """Start an API server for one CAPI manager and the manager on it (real CRDs of that
    version with conversion through the manager, k0s-fleet's CRDs and the stand-ins,
    CAPI's webhooks). Close it with :func:`stop_capi_env`."""
    gates = dict(feature_gates or {})
    label = "-".join(k.lower() for k, v in sorted(gates.items()) if v) or "default"
    name = name or f"capi-{version.replace('.', '-')}-{label}"
    server = await anyio.to_thread.run_sync(world.add_server, name)
    client = await server.client()
    try:
        manager = CapiManager(server, version, server.workdir / "capi", gates)
        await install_crds(client, crd_documents(CHART_CRDS, TEST_CRDS))
        await manager.install_crds(client)
        await anyio.to_thread.run_sync(manager.start)
        await manager.install_webhooks(client)
    except BaseException:
        await client.close()
        server.stop()
        raise
    log.info("CAPI %s manager on %s ready in %.1fs", version, name, manager.startup_seconds)
    return CapiEnv(version, server, manager, client)


async def stop_capi_env(env: CapiEnv) -> None:
    env.manager.stop()
    with contextlib.suppress(Exception):
        await env.client.close()
    env.server.stop()


class CapiEnvs:
    """Started on first use, shared by the tests of one pytest process, one per
    (CAPI version, feature gates): each is a management API server with its manager."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._envs: dict[tuple[str, tuple[tuple[str, bool], ...]], CapiEnv] = {}
        self._lock = anyio.Lock()

    async def get(self, version: str, feature_gates: dict[str, bool] | None = None
                  ) -> CapiEnv:
        key = (version, tuple(sorted((feature_gates or {}).items())))
        async with self._lock:
            if key not in self._envs:
                self._envs[key] = await start_capi_env(self.world, version,
                                                       feature_gates=feature_gates)
            env = self._envs[key]
        if not env.manager.running:
            raise RuntimeError(f"CAPI manager {version} died; see {env.manager.log_file}")
        return env

    def started(self) -> list[CapiEnv]:
        return list(self._envs.values())

    async def close(self) -> None:
        for env in self._envs.values():
            await stop_capi_env(env)
        self._envs.clear()
