"""Installing the charts and acting as their service accounts."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import yaml

from fleet.kube import KubeClient
from fleet.kube.resources import (
    CONFIGMAPS,
    PODS,
    SERVICE_ACCOUNTS,
)
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.capi import INFRA_GROUP, INFRA_MACHINES
from fleet.testing.world import ApiServer, free_port
from tests.helpers.charts import (
    CONTROLLER_CHART,
    DEPLOYMENTS,
    helm_cli,
    kubeconfig_file,
    pod_spec,
)
from tests.helpers.names import unique

AUDIENCE = "https://kubernetes.default.svc"


@dataclass
class AgentInstall:
    namespace: str
    release: str
    service_account: str
    daemonset: dict[str, Any]


async def agent_pod_on(client: KubeClient, inst: AgentInstall, node: str) -> dict[str, Any]:
    """The Pod the DaemonSet controller would create on ``node`` (there is no such
    controller here): the chart's pod template, bound to the node, owned by the DaemonSet."""
    ds = inst.daemonset
    meta = ds["metadata"]
    return await client.create(PODS, {
        "metadata": {
            "name": f"{inst.release}-{node}"[:63].rstrip("-"),
            "labels": ds["spec"]["template"]["metadata"]["labels"],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {**pod_spec(ds), "nodeName": node},
    }, inst.namespace)


async def token_for(client: KubeClient, inst: AgentInstall,
                    pod: dict[str, Any] | None) -> str:
    """A bound service-account token of the chart's ServiceAccount (TokenRequest API)."""
    spec: dict[str, Any] = {"audiences": [AUDIENCE], "expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod",
                                  "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"]["uid"]}
    resp = await client.create_subresource(
        SERVICE_ACCOUNTS, inst.service_account, "token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        inst.namespace)
    return str(resp["status"]["token"])





def chart_values(capi_ns: str) -> dict[str, Any]:
    """The values an operator would write (the test cluster's infra kind included)."""
    return {
        "replicaCount": 1,
        "leaderElection": {"leaseDurationSeconds": 15},
        "rbac": {"infrastructureMachines": [
            {"apiGroup": INFRA_GROUP, "resources": [INFRA_MACHINES.plural]}]},
        "fleet": {
            "clusters": {"namespaces": [capi_ns]},
            "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                         "allowUnverified": True},
            "agent": {"drainTimeout": "1s", "verifyTimeout": "1s"},
            "rollout": {"progressDeadlines": {"pending": "10s"}},
        },
    }


@dataclass
class ControllerInstall:
    namespace: str
    release: str
    capi_namespace: str
    service_account: str
    deployment: dict[str, Any]
    fleet_yaml: str


async def install_controller(server: ApiServer, admin: KubeClient, directory: Path,
                             values: dict[str, Any], *, namespace: str, capi_namespace: str
                             ) -> ControllerInstall:
    release = unique("k0s-fleet")
    values_file = directory / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    await helm_cli("install", release, CONTROLLER_CHART, "--namespace", namespace,
                   "--create-namespace", "--values", values_file,
                   "--kubeconfig", kubeconfig_file(server, directory))
    deploy = await admin.get(DEPLOYMENTS, release, namespace)
    cm = await admin.get(CONFIGMAPS, release, namespace)
    return ControllerInstall(namespace, release, capi_namespace,
                             pod_spec(deploy)["serviceAccountName"], deploy,
                             cm["data"]["fleet.yaml"])


async def service_account_token(admin: KubeClient, namespace: str, name: str) -> str:
    resp = await admin.create_subresource(
        SERVICE_ACCOUNTS, name, "token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600}}, namespace)
    return str(resp["status"]["token"])


def deployment_command(inst: ControllerInstall, pod_name: str, kubeconfig: Path,
                       config: Path) -> tuple[list[str], dict[str, str]]:
    """The Deployment's container command line and environment, as the kubelet would run
    it, with the fleet YAML and the token from files instead of volumes."""
    (c,) = pod_spec(inst.deployment)["containers"]
    fields = {"metadata.name": pod_name, "metadata.namespace": inst.namespace}
    env = {}
    for e in c["env"]:
        env[e["name"]] = (e["value"] if "value" in e
                          else fields[e["valueFrom"]["fieldRef"]["fieldPath"]])
    env["K0S_FLEET_CONFIG"] = str(config)
    # Several test processes share this host: the status port must not collide.
    env["K0S_FLEET_STATUS__PORT"] = str(free_port())
    cmd = [sys.executable, "-m", "fleet.cli", *c["args"], "--kubeconfig", str(kubeconfig)]
    return cmd, {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}


async def run_controller(inst: ControllerInstall, server: ApiServer, token: str,
                         directory: Path, *, task_status: anyio.abc.TaskStatus[Path]
                         = anyio.TASK_STATUS_IGNORED) -> None:
    """``k0s-fleet controller`` as the Deployment runs it, until cancelled."""
    kubeconfig = directory / "controller.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(server.kubeconfig(token=token, user="k0s-fleet")))
    config = directory / "fleet.yaml"
    config.write_text(inst.fleet_yaml)
    log = directory / "controller.log"
    cmd, env = deployment_command(inst, f"{inst.release}-7d9f8-abcde", kubeconfig, config)
    with log.open("wb") as out:
        proc = await anyio.open_process(cmd, stdout=out, stderr=out, env=env,
                                        cwd=str(REPO_ROOT), start_new_session=True)
    try:
        task_status.started(log)
        await proc.wait()
        raise AssertionError(f"controller exited {proc.returncode}:\n{_tail(log)}")
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.terminate()
                with anyio.move_on_after(10):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def _tail(log: Path | None, chars: int = 4000) -> str:
    return log.read_text()[-chars:] if log and log.exists() else ""


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str,
                   log: Path | None = None) -> None:
    try:
        with anyio.fail_after(timeout):
            while not await check():
                await anyio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}\n{_tail(log)}") from None
