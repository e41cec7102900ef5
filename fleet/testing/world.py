"""Start etcd and several kube-apiservers on loopback, with token auth and RBAC.

One etcd serves every API server, each under its own ``--etcd-prefix``, so that a
"fleet" of clusters costs one etcd plus one kube-apiserver per cluster. Processes run
in their own sessions and are killed on ``close()`` whatever happened before.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import yaml

from fleet.kube import AlreadyExistsError, ConflictError, KubeClient, KubeError, NotFoundError
from fleet.kube.resources import CRDS
from fleet.testing.binaries import REPO_ROOT, binary, capi_data_dir, pins

log = logging.getLogger(__name__)

CHART_CRDS = REPO_ROOT / "charts" / "k0s-fleet" / "crds"
# Stand-ins for what cannot be built here (k0smotron, k0s autopilot) and the test world's
# own provider kinds; Cluster API's CRDs are the real ones (capi_crds_dir).
TEST_CRDS = REPO_ROOT / "config" / "test-crds"


def capi_crds_dir(version: str | None = None) -> Path:
    """The real CRDs of Cluster API ``version`` (default: the pinned v1.14.x)."""
    return capi_data_dir(version or pins()["CAPI_VERSION"]) / "crds"
ADMIN_USER = "test-admin"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports free_port gave this process: two servers started in a row (a benchmark's ten
# replicas) could draw the same one before either bound it (seen once: two of ten
# bench replicas on one status port, one of them exiting "address already in use").
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free right now on every address, chosen below the kernel's ephemeral
    range: a port the kernel handed out (bind to 0) is also what the next outgoing
    connection of any process may take before the server that was meant to get it binds
    it (seen as "address already in use" of test controllers under load)."""
    rnd = random.SystemRandom()
    hi = _ephemeral_low() - 1
    for _ in range(200):
        port = rnd.randint(min(20000, hi - 1000), hi)
        if port in _HANDED_OUT:  # free now, but given to a server that may not be up yet
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_tcp(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} during start-up")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on {port} within {timeout}s")


def kill_group(proc: subprocess.Popen[bytes] | None, grace: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Etcd:
    workdir: Path
    port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        data = self.workdir / "etcd-data"
        data.mkdir(parents=True, exist_ok=True)
        logf = open(self.workdir / "etcd.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(binary("etcd")), f"--data-dir={data}", f"--listen-client-urls={self.url}",
             f"--listen-peer-urls=http://127.0.0.1:{self.peer_port}", "--unsafe-no-fsync"],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
        )
        logf.close()
        wait_tcp(self.port, self.proc, "etcd", 30)

    def stop(self) -> None:
        kill_group(self.proc)


@dataclass
class ApiServer:
    """One kube-apiserver = one simulated cluster's control plane."""

    name: str
    workdir: Path
    etcd: Etcd
    admin_token: str
    extra_args: list[str] = field(default_factory=list)
    # more bearer-token users (name -> token), in system:masters: a process whose
    # requests should be told apart from the tests' in an audit log
    extra_users: dict[str, str] = field(default_factory=dict)
    # groups of an extra user other than system:masters (name -> groups), e.g. a
    # ServiceAccount's identity that API Priority and Fairness does not exempt
    user_groups: dict[str, list[str]] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    startup_seconds: float = 0.0
    etcd_url: str | None = None  # etcd reached another way (e.g. through a proxy)
    # more environment for the process (e.g. GOGC / GOMEMLIMIT in a benchmark's world)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def cert_dir(self) -> Path:
        return self.workdir / "certs"

    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cert_dir.mkdir(exist_ok=True)
        tokens = self.workdir / "tokens.csv"
        if not tokens.exists():
            tokens.write_text(
                f'{self.admin_token},{ADMIN_USER},uid-admin,"system:masters"\n' + "".join(
                    f'{token},{user},uid-{user},'
                    f'"{",".join(self.user_groups.get(user, ["system:masters"]))}"\n'
                    for user, token in self.extra_users.items()))
        key = self.workdir / "sa.key"
        if not key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
            )
            subprocess.run(
                ["openssl", "rsa", "-in", str(key), "-pubout", "-out",
                 str(self.workdir / "sa.pub")], check=True, capture_output=True,
            )

    def command(self) -> list[str]:
        w = self.workdir
        return [
            str(binary("kube-apiserver")),
            f"--etcd-servers={self.etcd_url or self.etcd.url}",
            f"--etcd-prefix=/registry-{self.name}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.cert_dir}",
            f"--token-auth-file={w / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer=https://{self.name}.k0s-fleet.test",
            f"--service-account-key-file={w / 'sa.pub'}",
            f"--service-account-signing-key-file={w / 'sa.key'}",
            "--api-audiences=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=1",
            *self.extra_args,
        ]

    def start(self) -> None:
        self._prepare()
        for attempt in range(1, 6):
            log_path = self.workdir / "kube-apiserver.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            logf = open(log_path, "ab")  # noqa: SIM115
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                self.command(), stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
            logf.close()
            try:
                wait_tcp(self.port, self.proc, f"kube-apiserver {self.name}", 60)
                self._wait_ready(t0)
                return
            except RuntimeError:
                # A restart on the same port can find it taken for a moment: a client
                # reconnecting meanwhile may have been given it as its own ephemeral port
                # (loopback self-connect). Anything else is a real failure.
                with open(log_path, "rb") as fh:
                    fh.seek(offset)
                    if b"address already in use" not in fh.read() or attempt == 5:
                        raise
                log.warning("kube-apiserver %s: port %d busy; retrying", self.name, self.port)
                time.sleep(1.0)

    def _wait_ready(self, t0: float, timeout: float = 90.0) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"kube-apiserver {self.name} exited ({self.proc.returncode}); "
                    f"see {self.workdir / 'kube-apiserver.log'}"
                )
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        self.startup_seconds = time.monotonic() - t0
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"kube-apiserver {self.name} not ready after {timeout}s")

    def stop(self) -> None:
        kill_group(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def ca_pem(self) -> bytes:
        return (self.cert_dir / "apiserver.crt").read_bytes()

    def kubeconfig(self, token: str | None = None, user: str = ADMIN_USER) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {
                "server": self.url,
                "certificate-authority-data": base64.b64encode(self.ca_pem).decode(),
            }}],
            "users": [{"name": user, "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": user}}],
            "current-context": self.name,
        }

    def write_kubeconfig(self, path: Path | None = None) -> Path:
        path = path or self.workdir / "kubeconfig.yaml"
        path.write_text(yaml.safe_dump(self.kubeconfig()))
        return path

    async def client(self, *, token: str | None = None) -> KubeClient:
        return await KubeClient.from_kubeconfig(self.kubeconfig(token), name=self.name)


def crd_documents(*dirs: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for d in dirs:
        for f in sorted(d.glob("*.yaml")):
            docs.extend(x for x in yaml.safe_load_all(f.read_text()) if x)
    return docs


async def _create_or_replace_crd(client: KubeClient, doc: dict[str, Any]) -> None:
    while True:
        try:
            await client.create(CRDS, doc)
            return
        except AlreadyExistsError:
            pass
        try:
            current = await client.get(CRDS, doc["metadata"]["name"])
            if current["metadata"].get("deletionTimestamp"):
                await anyio.sleep(0.2)  # terminating: create it again once it is gone
                continue
            rv = current["metadata"]["resourceVersion"]
            await client.replace(CRDS, {**doc, "metadata": {**doc["metadata"],
                                                             "resourceVersion": rv}})
            return
        except (NotFoundError, ConflictError):
            continue  # gone or changed between the calls: look again


async def install_crds(client: KubeClient, docs: list[dict[str, Any]],
                       timeout: float = 60.0) -> None:
    """Create (or update) CRDs and wait until every one is Established. A CRD still
    being deleted (its objects being cleaned up) is waited for and created anew."""
    with anyio.fail_after(timeout):
        for doc in docs:
            await _create_or_replace_crd(client, doc)
    with anyio.fail_after(timeout):
        for doc in docs:
            while True:
                crd = await client.get(CRDS, doc["metadata"]["name"])
                # A fresh CRD's status may briefly hold `conditions: null`.
                conds = {c["type"]: c["status"]
                         for c in (crd.get("status") or {}).get("conditions") or []}
                if conds.get("Established") == "True":
                    break
                await anyio.sleep(0.05)
            # Established can precede discovery; wait until the resource answers a list.
            group = doc["spec"]["group"]
            served = [v for v in doc["spec"]["versions"] if v.get("served", True)]
            version = next((v for v in served if v.get("storage")), served[0])["name"]
            plural = doc["spec"]["names"]["plural"]
            while True:
                try:
                    await client.request("GET", f"/apis/{group}/{version}/{plural}",
                                         query={"limit": 1})
                    break
                except KubeError:
                    await anyio.sleep(0.05)


class World:
    """etcd + named kube-apiservers. Use as a context manager or call close()."""

    def __init__(self, names: list[str], *, workdir: Path | None = None,
                 extra_args: dict[str, list[str]] | None = None,
                 users: dict[str, str] | None = None,
                 groups: dict[str, list[str]] | None = None) -> None:
        """``users``: more bearer-token users (name -> token) on every server, in
        system:masters unless ``groups`` names theirs."""
        self._own_tmp = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="k0s-fleet-world-"))
        self.etcd = Etcd(self.workdir)
        token = secrets.token_hex(16)
        self.admin_token = token
        extra_args = extra_args or {}
        self.servers = {
            n: ApiServer(n, self.workdir / n, self.etcd, token, extra_args.get(n, []),
                         dict(users or {}), dict(groups or {}))
            for n in names
        }

    def __getitem__(self, name: str) -> ApiServer:
        return self.servers[name]

    def start(self) -> World:
        try:
            self.etcd.start()
            # Start all API servers at once; each waits on its own readiness.
            for s in self.servers.values():
                s._prepare()
            with concurrent.futures.ThreadPoolExecutor(len(self.servers)) as pool:
                list(pool.map(lambda s: s.start(), self.servers.values()))
        except BaseException:
            self.close()
            raise
        return self

    def add_server(self, name: str, *, extra_args: list[str] | None = None,
                   etcd_url: str | None = None) -> ApiServer:
        """Start one more kube-apiserver on this world's etcd (e.g. one a test may stop
        and restart without disturbing the servers other tests share); ``etcd_url``
        reaches that etcd another way (a proxy in between)."""
        if name in self.servers:
            raise ValueError(f"test world already has a server named {name!r}")
        token = next(iter(self.servers.values())).admin_token if self.servers else \
            secrets.token_hex(16)
        server = ApiServer(name, self.workdir / name, self.etcd, token, list(extra_args or []),
                           etcd_url=etcd_url)
        self.servers[name] = server
        server.start()
        return server

    def remove_server(self, name: str) -> None:
        """Stop a server :meth:`add_server` started and forget it, so that what runs on
        every server of the world later (:meth:`install_crds`) does not reach for it."""
        self.servers.pop(name).stop()

    async def install_crds(self) -> None:
        """k0s-fleet's CRDs, the stand-ins and Cluster API's real CRDs on every server."""
        docs = crd_documents(CHART_CRDS, TEST_CRDS, capi_crds_dir())
        async with anyio.create_task_group() as tg:
            for s in self.servers.values():
                tg.start_soon(self._install_one, s, docs)

    @staticmethod
    async def _install_one(server: ApiServer, docs: list[dict[str, Any]]) -> None:
        async with await server.client() as c:
            await install_crds(c, docs)

    def close(self) -> None:
        for s in self.servers.values():
            s.stop()
        self.etcd.stop()
        if self._own_tmp and not os.environ.get("K0S_FLEET_KEEP_WORLD"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> World:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
