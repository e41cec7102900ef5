"""Hostile kubeconfig Secrets (issue #29 finding 1), performed on the real test world.

Whoever may write Secrets in a cluster's namespace writes its ``<cluster>-kubeconfig``.
Each test plants such a Secret on the real management API server and lets the real code
paths that read it (the controller's cluster registry and the whole controller, the
extension's workload clients, the rollout observer) have it: an ``exec`` plugin that would
create a marker file, a ``tokenFile`` naming a secret file of the controller's host with
the Secret's ``server`` a listener of the test's own, a ``client-key`` path. The attack is
refused before anything runs or connects, the cluster is unreachable naming the field,
and the healthy cluster beside it goes on.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet.config.models import FleetConfig
from fleet.controllers.observe import SECRET_FIELD_SELECTOR
from fleet.extension.workload import SecretWorkloadClients
from fleet.kube import KubeClient, NotFoundError, UnreachableError
from fleet.kube.cache import ObjectCache
from fleet.kube.inline import KubeconfigNotAllowedError
from fleet.kube.resources import MACHINE_DEPLOYMENTS, NODE_PLANS, NODES, SECRETS
from fleet.kube.watch import Reflector
from fleet.planner import conditions as C
from fleet.rollout.observe import workload_client
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd
from fleet.testing.world import World
from fleet.world.clusters import ClusterRegistry, kubeconfig_secret
from fleet.world.model import ClusterKey
from tests.helpers.controller import V2, fleet_config, running_controller, tuning
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio


async def until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    with anyio.fail_after(timeout):
        while not pred():
            await anyio.sleep(0.02)
    assert pred(), what


async def until_async(pred: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    with anyio.fail_after(timeout):
        while not (got := await pred()):
            await anyio.sleep(0.2)
    return got


def exec_kubeconfig(good: dict[str, Any], marker: Path) -> dict[str, Any]:
    """``good`` whose user runs a command (creating ``marker``) for its credential, as an
    exec plugin does: the command even prints a working ExecCredential."""
    token = good["users"][0]["user"]["token"]
    credential = json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1",
                             "kind": "ExecCredential", "status": {"token": token}})
    config: dict[str, Any] = json.loads(json.dumps(good))
    config["users"][0]["user"] = {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "/bin/sh",
        "args": ["-c", f"touch {marker}; printf '%s' '{credential}'"],
        "interactiveMode": "Never"}}
    return config


@asynccontextmanager
async def registry_on(mgmt: KubeClient, namespace: str, **kw: Any
                      ) -> AsyncIterator[ClusterRegistry]:
    """A ClusterRegistry following the kubeconfig Secrets of ``namespace`` as the
    controller's does (a watch of CAPI's Secret type), with the default client factory."""
    secrets = ObjectCache("Secret")
    reflector = Reflector(mgmt, SECRETS, namespace=namespace, listener=secrets.on_event,
                          field_selector=SECRET_FIELD_SELECTOR)
    registry = ClusterRegistry(secrets, on_change=lambda: None, watch_timeout=30,
                               unreachable_after=3, **kw)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reflector.run)
        await reflector.synced.wait()
        await tg.start(registry.run)
        try:
            yield registry
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def listener() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A TCP server on 127.0.0.1 recording every byte anyone sends it: the hostile
    Secret's ``server``."""
    received: list[bytes] = []

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                while True:
                    received.append(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

    server = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = server.extra(anyio.abc.SocketAttribute.local_port)
    async with server, anyio.create_task_group() as tg:
        tg.start_soon(server.serve, handle)
        try:
            yield f"http://127.0.0.1:{port}", received
        finally:
            tg.cancel_scope.cancel()


async def test_exec_plugin_in_a_kubeconfig_secret_never_runs(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, namespace: str,
        tmp_path: Path) -> None:
    marker = tmp_path / "exec-ran"
    on_wl1 = unique("healthy")
    await wl1.create(NODES, {"metadata": {"name": on_wl1}})
    evil, good = (namespace, "evil"), (namespace, "good")
    await mgmt.create(SECRETS, kubeconfig_secret(
        "evil-kubeconfig", namespace, "evil",
        exec_kubeconfig(crds_installed["wl1"].kubeconfig(), marker)))
    await mgmt.create(SECRETS, kubeconfig_secret("good-kubeconfig", namespace, "good",
                                                 crds_installed["wl1"].kubeconfig()))
    try:
        async with registry_on(mgmt, namespace) as registry:
            registry.want({evil: "evil-kubeconfig", good: "good-kubeconfig"})

            def decided() -> bool:
                wc, ok = registry.get(evil), registry.get(good)
                return marker.exists() or (
                    wc is not None and (wc.error is not None or wc.client is not None)
                    and ok is not None and ok.observed and ok.nodes.get(on_wl1) is not None)
            await until(decided, 30, "the exec cluster decided, the healthy one observed")
            assert not marker.exists(), "the Secret's exec plugin ran in the controller"
            wc = registry.get(evil)
            assert wc is not None and wc.client is None
            assert wc.error == (f"kubeconfig Secret {namespace}/evil-kubeconfig: "
                                "users[0].user.exec is not allowed in a kubeconfig from a "
                                "Secret (it would run a command in the controller)")
            down = registry.unreachable(evil)
            assert down is not None and "users[0].user.exec" in down[1]
            assert registry.settled(evil)  # an answer: nothing waits for it
            assert registry.unreachable(good) is None

        # The extension's clients (every replica) and the rollout observer refuse it too.
        clients = SecretWorkloadClients(mgmt)
        try:
            with pytest.raises(UnreachableError, match=r"users\[0\]\.user\.exec is not "
                               "allowed"):
                await clients(*evil)
            assert [n for n in (await (await clients(*good)).list(NODES)).items
                    if n["metadata"]["name"] == on_wl1]
        finally:
            await clients.close()
        with pytest.raises(KubeconfigNotAllowedError, match="exec"):
            await workload_client(mgmt, FleetConfig(), *evil)
        # and the client itself, whoever calls it: never kubernetes-asyncio's exec
        with pytest.raises(KubeconfigNotAllowedError, match="exec"):
            await KubeClient.for_many(exec_kubeconfig(crds_installed["wl1"].kubeconfig(),
                                                      marker), name="direct")
        assert not marker.exists()
    finally:
        await wl1.delete(NODES, on_wl1)


async def test_token_file_is_never_read_nor_sent(
        mgmt: KubeClient, namespace: str, tmp_path: Path) -> None:
    """tokenFile naming a file of the controller's host (its service account token, in a
    pod): refused before any connection; the Secret's server hears nothing. The operator's
    allowance for the namespace (and only it) lets the same Secret work."""
    secret_token = f"controller-own-token-{unique('t')}"
    token_file = tmp_path / "token"
    token_file.write_text(secret_token)
    key: ClusterKey = (namespace, "leak")
    async with listener() as (server, received):
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "x", "cluster": {"server": server}}],
            "users": [{"name": "x", "user": {"tokenFile": str(token_file)}}],
            "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}
        await mgmt.create(SECRETS, kubeconfig_secret("leak-kubeconfig", namespace, "leak",
                                                     config))
        async with registry_on(mgmt, namespace) as registry:
            registry.want({key: "leak-kubeconfig"})

            def decided() -> bool:
                wc = registry.get(key)
                return bool(received) or (wc is not None and wc.error is not None)
            await until(decided, 30, "refused, or something sent to the Secret's server")
            sent = b"".join(received)
            assert secret_token.encode() not in sent, "the token file was sent"
            assert sent == b""  # not even a connection with nothing in it
            wc = registry.get(key)
            assert wc is not None and wc.error is not None and wc.client is None
            assert "users[0].user.tokenFile is not allowed" in wc.error
            down = registry.unreachable(key)
            assert down is not None and "tokenFile" in down[1]
        with pytest.raises(UnreachableError, match="tokenFile"):
            await SecretWorkloadClients(mgmt)(*key)
        assert received == []

        # The operator allows file credentials in this namespace: the same Secret is used
        # (and so the file is read and sent: that is what the allowance means).
        async with registry_on(mgmt, namespace,
                               allow_file_credentials=lambda ns: ns == namespace
                               ) as registry:
            registry.want({key: "leak-kubeconfig"})
            await until(lambda: secret_token.encode() in b"".join(received), 30,
                        "allowed: the token is sent")
            wc = registry.get(key)
            assert wc is not None and wc.error is None


def _self_signed() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:admin")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


async def test_client_key_and_ca_paths_are_never_read(
        mgmt: KubeClient, crds_installed: World, namespace: str, tmp_path: Path) -> None:
    """client-key (and certificate-authority) naming files of the controller's host: the
    Secret is refused, no client is built from it."""
    cert, key_pem = _self_signed()
    key_file = tmp_path / "controller.key"
    key_file.write_bytes(key_pem)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(crds_installed["wl1"].ca_pem)
    for name, cluster_extra, user, field in [
        ("keypath", {}, {"client-certificate-data": base64.b64encode(cert).decode(),
                         "client-key": str(key_file)}, "users[0].user.client-key"),
        ("capath", {"certificate-authority": str(ca_file)},
         {"token": crds_installed["wl1"].admin_token},
         "clusters[0].cluster.certificate-authority"),
    ]:
        config = crds_installed["wl1"].kubeconfig()
        if cluster_extra:
            del config["clusters"][0]["cluster"]["certificate-authority-data"]
        config["clusters"][0]["cluster"].update(cluster_extra)
        config["users"][0]["user"] = user
        await mgmt.create(SECRETS, kubeconfig_secret(f"{name}-kubeconfig", namespace, name,
                                                     config))
        key: ClusterKey = (namespace, name)
        async with registry_on(mgmt, namespace) as registry:
            registry.want({key: f"{name}-kubeconfig"})

            def decided(key: ClusterKey = key) -> bool:
                wc = registry.get(key)
                return wc is not None and (wc.error is not None or wc.client is not None)
            await until(decided, 30, "refused or built")
            wc = registry.get(key)
            assert wc is not None
            assert wc.client is None, f"a client was built from a Secret naming {field}"
            assert wc.error is not None and f"{field} is not allowed" in wc.error
            down = registry.unreachable(key)
            assert down is not None and field in down[1]


async def test_operator_kubeconfig_file_keeps_its_features(
        crds_installed: World, tmp_path: Path) -> None:
    """The management kubeconfig is the operator's file: tokenFile and a CA path work."""
    server = crds_installed["wl1"]
    (tmp_path / "token").write_text(server.admin_token)
    (tmp_path / "ca.crt").write_bytes(server.ca_pem)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "m",
        "clusters": [{"name": "m", "cluster": {"server": server.url,
                                               "certificate-authority": "ca.crt"}}],
        "users": [{"name": "m", "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "m", "context": {"cluster": "m", "user": "m"}}]}))
    for transport in ("light", "auto"):
        async with await KubeClient.from_kubeconfig_file(str(path), name="management",
                                                         transport=transport) as c:
            assert (await c.server_version())["major"]


async def test_refused_cluster_is_unreachable_and_the_fleet_goes_on(
        *, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient, crds_installed: World,
        namespace: str, tmp_path: Path) -> None:
    """The whole controller: a cluster whose Secret has an exec plugin is unreachable, its
    MachineDeployment says so naming the field, nothing is dispatched there and the
    plugin never runs; the healthy cluster beside it is upgraded."""
    await ensure_infra_crd(mgmt)
    marker = tmp_path / "exec-ran"
    bad_name, good_name = unique("refused"), unique("healthy")
    bad = await create_cluster(
        mgmt, wl2, exec_kubeconfig(crds_installed["wl2"].kubeconfig(), marker),
        namespace=namespace, name=bad_name, control_planes=0, workers=2, max_unavailable=1)
    good = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(),
                                namespace=namespace, name=good_name, control_planes=0,
                                workers=2, max_unavailable=1)
    config = fleet_config(namespace, maxConcurrentClusters=2,
                          progressDeadlines={"pending": "10m"})
    try:
        async with running_controller(mgmt, config,
                                      tuning=tuning(unreachable_after=3)) as controller:
            await bump(mgmt, bad, V2)
            await bump(mgmt, good, V2)

            async def healthy_started() -> list[Any]:
                return [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
                        if p["spec"]["clusterName"] == good_name]
            await until_async(healthy_started, 60)

            async def md_says_refused() -> bool:
                md = await mgmt.get(MACHINE_DEPLOYMENTS, bad.md or "", namespace)
                return any(c.get("type") == C.PROGRESSING
                           and c.get("reason") == C.R_CLUSTER_UNREACHABLE
                           and "users[0].user.exec is not allowed" in c.get("message", "")
                           for c in (md.get("status") or {}).get("conditions") or [])
            async def refused_or_ran() -> bool:
                return marker.exists() or await md_says_refused()
            await until_async(refused_or_ran, 60)
            assert not marker.exists(), "the Secret's exec plugin ran in the controller"
            assert await md_says_refused()
            assert controller.registry.unreachable((namespace, bad_name)) is not None
            plans = (await mgmt.list(NODE_PLANS, namespace)).items
            assert [p for p in plans if p["spec"]["clusterName"] == bad_name] == []
            assert not marker.exists(), "the Secret's exec plugin ran in the controller"
    finally:
        for client, fc in ((wl2, bad), (wl1, good)):
            for node in fc.workers:
                with contextlib.suppress(NotFoundError):
                    await client.delete(NODES, node)
