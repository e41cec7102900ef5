"""The image ``make image`` builds, run with podman as the charts run it.

Not part of ``make test``: ``make image`` installs the tools (hack/image/tools.sh), builds
the OCI archive (hack/image/build.sh) and runs these. Without podman, runc and skopeo they
are skipped. The archive is build/image/k0s-fleet-<version>.oci.tar
(K0S_FLEET_IMAGE_ARCHIVE overrides); it is built first when missing, and loaded into
k0s-fleet's private podman store (hack/image/podman.sh).

Each container gets the pod spec the chart renders, translated by tests/image/pod.py
(user, capabilities, read-only root filesystem, seccomp, no-new-privileges, host PID,
memory limit, volumes, environment, args). The controller talks to the test world's
management API server as its in-cluster ServiceAccount: the chart installed by helm, a
TokenRequest token, the CA and namespace mounted where the kubelet puts them, and
KUBERNETES_SERVICE_HOST/PORT. The agent upgrades a simulated node
(fleet.testing.simnode) from its container, with a Pod-bound token of its chart. The one
deliberate difference from a pod: the host's network namespace (the API and release
servers listen on 127.0.0.1), hence a free status port.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from fleet.contract.signal import HAPPY_PATH, SignalState
from fleet.kube import KubeClient
from fleet.kube.resources import LEASES
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.capi import ensure_infra_crd
from fleet.testing.releases import Release, ReleaseServer, fake_k0s
from fleet.testing.simnode import SimNode
from fleet.testing.world import ApiServer, World, free_port
from tests.helpers.charts import (
    AGENT_CHART,
    CONTROLLER_CHART,
    DAEMONSETS,
    create_namespace,
    helm_cli,
    kubeconfig_file,
    pod_spec,
    render,
)
from tests.helpers.dockerfile import instructions
from tests.helpers.names import unique
from tests.helpers.rbac import (
    AgentInstall,
    agent_pod_on,
    chart_values,
    install_controller,
    service_account_token,
    token_for,
)
from tests.image.pod import PodRun, container_args, memory_bytes, podman_run_args

HACK = REPO_ROOT / "hack" / "image"
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
REPOSITORY = yaml.safe_load((CONTROLLER_CHART / "values.yaml").read_text())["image"][
    "repository"]
REF = f"{REPOSITORY}:{VERSION}"
ARCHIVE = Path(os.environ.get("K0S_FLEET_IMAGE_ARCHIVE")
               or REPO_ROOT / "build" / "image" / f"k0s-fleet-{VERSION}.oci.tar")
RUN_TOOLS = ("podman", "runc", "skopeo")
BUILD_TOOLS = ("buildah", "mmdebstrap")
MISSING = [t for t in RUN_TOOLS + (() if ARCHIVE.exists() else BUILD_TOOLS)
           if shutil.which(t) is None]

pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"image tools not installed: {', '.join(MISSING)} "
    "(`make image` installs them with hack/image/tools.sh, builds and runs these tests)")

# Run inside the container (python is the image's only tool): what the kernel says about
# the process the container started, and what the root filesystem allows.
PROBE = r"""
import json, os
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines())
def writable(d):
    try:
        open(os.path.join(d, ".probe"), "w").close()
        os.unlink(os.path.join(d, ".probe"))
        return True
    except OSError:
        return False
limit = None
for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    if os.path.exists(f):
        limit = open(f).read().strip()
        break
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "seccomp": status["Seccomp"].strip(), "pid_ns": os.readlink("/proc/self/ns/pid"),
    "root_writable": writable("/"), "opt_writable": writable("/opt/k0s-fleet"),
    "tmp_writable": writable("/tmp"), "memory_limit": limit,
}))
"""


def podman(*args: str | Path, check: bool = True,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(HACK / "podman.sh"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(map(str, args))} exited "
                             f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def image() -> str:
    """The archive's image, loaded into the store under the reference it carries."""
    if not ARCHIVE.exists():
        subprocess.run([str(HACK / "build.sh")], check=True, timeout=1800)
    out = podman("load", "--input", ARCHIVE).stdout
    assert f"Loaded image: {REF}" in out, out
    return REF


def probe(image: str, run_args: list[str]) -> dict[str, Any]:
    out = podman("run", "--rm", *run_args, "--entrypoint", "python", image, "-c", PROBE)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


# -- the archive -------------------------------------------------------------------------
def test_archive_is_the_chart_default_reference_with_the_dockerfile_labels(
        image: str) -> None:
    index = json.loads(subprocess.run(["tar", "-xOf", str(ARCHIVE), "index.json"],
                                      capture_output=True, check=True).stdout)
    (manifest,) = index["manifests"]
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == REF
    config = json.loads(subprocess.run(
        ["skopeo", "inspect", "--config", f"oci-archive:{ARCHIVE}"], capture_output=True,
        check=True, text=True).stdout)["config"]
    labels = {k: v for k, v in config["Labels"].items() if k.startswith("org.opencontainers")}
    expected = dict(kv.split("=", 1) for op, rest in instructions() if op == "LABEL"
                    for kv in shlex.split(rest))
    assert {k: v.replace("${VERSION}", VERSION) for k, v in expected.items()} == labels
    assert labels["org.opencontainers.image.version"] == VERSION
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["k0s-fleet"]
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
    print(f"\n[image] {REF}: {size / 1e6:.0f} MB unpacked, archive "
          f"{ARCHIVE.stat().st_size / 1e6:.0f} MB ({len(config.get('Env', []))} env)")


# -- CLIs as the charts run them ---------------------------------------------------------
def controller_pod(directory: Path) -> tuple[dict[str, Any], PodRun]:
    pod = pod_spec(render(CONTROLLER_CHART).workload())
    config = directory / "config"
    config.mkdir()
    (config / "fleet.yaml").write_text("{}\n")
    return pod, PodRun(fields={"metadata.name": "k0s-fleet-5d9c7-x2x4q",
                               "metadata.namespace": "fleet-system"},
                       volumes={"config": config})


def agent_pod(directory: Path) -> tuple[dict[str, Any], PodRun]:
    pod = pod_spec(render(AGENT_CHART).workload())
    host = {v["name"]: directory / "host" / v["name"] for v in pod["volumes"]
            if "hostPath" in v}
    for d in host.values():
        d.mkdir(parents=True)
    return pod, PodRun(fields={"spec.nodeName": "worker-0"}, volumes=host)


def test_cli_help_as_the_controller_chart_runs_it(image: str, tmp_path: Path) -> None:
    pod, run = controller_pod(tmp_path)
    args = podman_run_args(pod, run)
    assert container_args(pod)[0] == "controller"
    out = podman("run", "--rm", *args, image, "--help").stdout
    assert "usage: k0s-fleet" in out and "controller" in out and "agent" in out
    out = podman("run", "--rm", *args, image, "controller", "--help").stdout
    assert "usage: k0s-fleet controller" in out
    # What the chart's securityContext promises, as the kernel reports it.
    seen = probe(image, args)
    assert (seen["uid"], seen["gid"]) == (65532, 65532)
    assert seen["cap_eff"] == "0000000000000000"
    assert seen["no_new_privs"] == "1" and seen["seccomp"] == "2"  # filter mode
    assert not seen["root_writable"] and not seen["opt_writable"] and seen["tmp_writable"]
    assert seen["pid_ns"] != os.readlink("/proc/self/ns/pid")  # its own PID namespace
    limit = pod["containers"][0]["resources"]["limits"]["memory"]
    assert seen["memory_limit"] == str(memory_bytes(limit))


def test_agent_help_as_the_agent_chart_runs_it(image: str, tmp_path: Path) -> None:
    pod, run = agent_pod(tmp_path)
    args = podman_run_args(pod, run)
    assert container_args(pod)[0] == "agent"
    out = podman("run", "--rm", *args, image, "agent", "--help").stdout
    assert "usage: k0s-fleet agent" in out
    seen = probe(image, args)
    # uid 0 without any capability, read-only root, the host's PID namespace.
    assert (seen["uid"], seen["gid"]) == (0, 0)
    assert seen["cap_eff"] == "0000000000000000"
    assert seen["no_new_privs"] == "1" and seen["seccomp"] == "2"
    assert not seen["root_writable"] and seen["tmp_writable"]
    assert seen["pid_ns"] == os.readlink("/proc/self/ns/pid")  # hostPID


# -- the controller against the test world ------------------------------------------------
def readyz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@dataclass(frozen=True)
class ChartController:
    """The controller chart installed by helm, and what a kubelet would give its pod."""

    pod: dict[str, Any]
    run: PodRun
    status_port: int
    pod_name: str
    namespace: str


async def chart_controller(server: ApiServer, mgmt: KubeClient,
                           directory: Path) -> ChartController:
    await ensure_infra_crd(mgmt)
    capi_ns, ns = unique("capi-img"), unique("kf-img")
    await create_namespace(mgmt, capi_ns)
    inst = await install_controller(server, mgmt, directory, chart_values(capi_ns),
                                    namespace=ns, capi_namespace=capi_ns)
    # The kubelet's files: ConfigMap volume, projected ServiceAccount token, CA, namespace.
    config = directory / "configmap"
    config.mkdir()
    (config / "fleet.yaml").write_text(inst.fleet_yaml)
    sa = directory / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(await service_account_token(mgmt, ns, inst.service_account))
    (sa / "ca.crt").write_bytes(server.ca_pem)
    (sa / "namespace").write_text(ns)
    for f in (config, sa, *config.iterdir(), *sa.iterdir()):
        f.chmod(0o755 if f.is_dir() else 0o644)  # readable by uid 65532, as the kubelet does

    pod = pod_spec(inst.deployment)  # as the API server stored it
    status_port = free_port()  # host network: the chart's 8080 may be taken here
    for e in pod["containers"][0]["env"]:
        if e["name"] == "K0S_FLEET_STATUS__PORT":
            e["value"] = str(status_port)
    pod_name = f"{inst.release}-7d9f8-{uuid.uuid4().hex[:5]}"
    run = PodRun(fields={"metadata.name": pod_name, "metadata.namespace": ns},
                 volumes={"config": config}, service_account=sa,
                 api_server=("127.0.0.1", server.port), network="host")
    return ChartController(pod, run, status_port, pod_name, ns)


def run_controller(image: str, ctl: ChartController) -> str:
    """``podman run`` the chart's controller container; returns its name."""
    name = f"k0s-fleet-image-{uuid.uuid4().hex[:8]}"
    podman("run", "--detach", "--name", name,
           f"--stop-timeout={ctl.pod['terminationGracePeriodSeconds']}",
           *podman_run_args(ctl.pod, ctl.run), image, *container_args(ctl.pod))
    return name


@pytest.mark.anyio
async def test_controller_in_the_image_becomes_ready_as_the_chart_s_service_account(
        image: str, crds_installed: World, mgmt: KubeClient, tmp_path: Path) -> None:
    ctl = await chart_controller(crds_installed["mgmt"], mgmt, tmp_path)
    pod, ns, pod_name, status_port = ctl.pod, ctl.namespace, ctl.pod_name, ctl.status_port
    grace = pod["terminationGracePeriodSeconds"]
    t0 = time.monotonic()
    name = run_controller(image, ctl)
    try:
        def logs() -> str:
            p = podman("logs", name, check=False)
            return (p.stdout + p.stderr)[-4000:]

        ready_after = None
        with anyio.fail_after(180):
            while ready_after is None:
                code = await anyio.to_thread.run_sync(readyz, status_port)
                if code == 200:
                    ready_after = time.monotonic() - t0
                    break
                state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
                assert state == "running", f"controller container {state}:\n{logs()}"
                await anyio.sleep(0.2)
        print(f"\n[image] controller in the container: /readyz 200 after {ready_after:.2f} s "
              "(podman run -> ready)")

        async def leading() -> bool:
            lease = await mgmt.get_or_none(LEASES, "k0s-fleet-controller", ns)
            return bool(lease and lease["spec"].get("holderIdentity") == pod_name)

        with anyio.fail_after(60):
            while not await leading():
                await anyio.sleep(0.2)

        # SIGTERM to pid 1 stops it cleanly within the pod's grace period.
        t1 = time.monotonic()
        podman("stop", name, timeout=grace + 30)
        stopped_after = time.monotonic() - t1
        code = int(podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout)
        text = logs()
        assert code == 0, f"exit {code} after SIGTERM:\n{text}"
        assert stopped_after < grace, stopped_after
        assert "Traceback" not in text and "orbidden" not in text, text
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


# -- the agent upgrading a node ----------------------------------------------------------
def container_release(rs: ReleaseServer, version: str) -> Release:
    """A fake k0s release whose interpreter exists on this host and in the image (the
    agent runs ``k0s version`` of the download inside its container)."""
    body = fake_k0s(version, size=1024 * 1024, python="/usr/bin/python3")
    rel = Release(version=version, body=body, sha256=hashlib.sha256(body).hexdigest(),
                  url=f"{rs.base_url}/k0s/{version}")
    rs.releases[version] = rel
    return rel


@pytest.mark.anyio
async def test_agent_in_the_image_upgrades_a_node_as_the_chart_runs_it(
        image: str, crds_installed: World, wl1: KubeClient, tmp_path: Path) -> None:
    """The agent chart (helm, defaults but the release server as the allowed download
    prefix) on a simulated node: its DaemonSet's container
    with the node's directories as its hostPath volumes, a Pod-bound token, the host's PID
    namespace; it downloads, swaps the binary, signals the host's k0s process and
    verifies, as uid 0 without capabilities on a read-only root filesystem."""
    server = crds_installed["wl1"]
    ns, release = unique("kfa-img"), unique("k0s-fleet-agent")
    await create_namespace(wl1, ns, pod_security="privileged")
    old, new = "v1.31.3+k0s.0", "v1.32.1+k0s.0"
    async with ReleaseServer() as rs:
        # the agent downloads only under the prefixes it is installed with
        await helm_cli("install", release, AGENT_CHART, "--namespace", ns, "--kubeconfig",
                       kubeconfig_file(server, tmp_path), "--set-json",
                       f'download.allowedUrlPrefixes=["{rs.base_url}/k0s/"]')
        ds = await wl1.get(DAEMONSETS, release, ns)
        inst = AgentInstall(ns, release, pod_spec(ds)["serviceAccountName"], ds)
        container_release(rs, new)
        async with SimNode.running(wl1, server.kubeconfig(), tmp_path / "node",
                                   container_release(rs, old), name=unique("img-node"),
                                   start_agent=False) as node:
            await agent_upgrade(image, node, rs.releases[new], inst, server, tmp_path=tmp_path)


async def agent_upgrade(image: str, node: SimNode, target: Release, inst: AgentInstall,
                        server: ApiServer, *, tmp_path: Path) -> None:
    wl1 = node.client
    bound = await agent_pod_on(wl1, inst, node.name)
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(await token_for(wl1, inst, bound))
    (sa / "ca.crt").write_bytes(server.ca_pem)
    (sa / "namespace").write_text(inst.namespace)
    pod = pod_spec(inst.daemonset)
    run = PodRun(fields={"spec.nodeName": node.name},
                 volumes={"k0s-bin": node.binary.parent, "k0s-run": node.socket.parent,
                          "state": node.state_dir},
                 service_account=sa, api_server=("127.0.0.1", server.port),
                 network="host")  # the API and release servers listen on 127.0.0.1
    name = f"k0s-fleet-agent-image-{uuid.uuid4().hex[:8]}"
    podman("run", "--detach", "--name", name, *podman_run_args(pod, run), image,
           *container_args(pod))
    try:
        def logs() -> str:
            p = podman("logs", name, check=False)
            return (p.stdout + p.stderr)[-4000:]

        with anyio.fail_after(60):
            while "watching " not in logs():
                state = podman("inspect", "--format", "{{.State.Status}}",
                               name).stdout.strip()
                assert state == "running", f"agent container {state}:\n{logs()}"
                await anyio.sleep(0.5)
        first_starts = node.starts
        plan = await node.request(target)
        sig = await node.wait_for(plan, {s for s in SignalState if s.terminal},
                                  timeout=120)
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, (sig.status.reason, logs())
        assert node.states(plan) == [str(s) for s in HAPPY_PATH]
        assert await node.running_version() == target.version
        assert node.binary.read_bytes() == target.body
        assert node.starts == first_starts + 1  # the host's k0s, restarted by signal
        text = logs()
        assert "Traceback" not in text and "orbidden" not in text, text
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)
