"""A user's first hour, run for real against the test world: the transcript in
docs/operations.md ("A first hour, transcript") is this script's output, trimmed.

    .venv/bin/python hack/first_hour.py [--out transcript.md] [--workdir DIR]

What it stands up (the part a real user already has): a management API server and two
workload API servers (real kube-apiserver + etcd of `make testenv`) holding two Cluster API
clusters of k0s nodes, whose nodes are scripted (fleet.testing.responder; one worker of
edge-02 fails its download), and a Prometheus (the pinned one) scraping the controller
with the chart's alert rules as they are. Then every command of the transcript runs in a
clean shell (``env -i``: HOME, PATH and only KUBECONFIG) from the `make dist` output:
install the CLI, install the chart, ask for a version, watch it, read the alert.

The test world has no kubelet: the chart's Deployment is created but runs no pod, so the
script runs the controller the pod would run as a local process, with the fleet YAML the
chart rendered into its ConfigMap, and says so in the transcript.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import yaml

from fleet.contract.signal import SignalState
from fleet.kube import KubeClient
from fleet.kube.resources import CLUSTERS, CONFIGMAPS, NAMESPACES
from fleet.testing.binaries import REPO_ROOT, binary
from fleet.testing.capi import create_cluster, ensure_infra_crd
from fleet.testing.releases import ReleaseServer
from fleet.testing.responder import Behaviour, NodeResponder
from fleet.testing.world import World, free_port

FROM, TO = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
FLEET_NS, SYSTEM_NS = "fleet-prod", "k0s-fleet-system"
RING = "k0s-fleet.io/ring"


class Transcript:
    """Runs commands in a clean shell and keeps what a terminal would have shown."""

    def __init__(self, work: Path, kubeconfig: Path) -> None:
        self.work = work
        self.home = work / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        bindir = work / "bin"
        bindir.mkdir(exist_ok=True)
        with contextlib.suppress(FileExistsError):
            (bindir / "helm").symlink_to(binary("helm"))
        # TERM and COLUMNS: what a terminal sets (the tables are laid out to its width)
        self.env = {"HOME": str(self.home), "KUBECONFIG": str(kubeconfig), "TERM": "dumb",
                    "COLUMNS": "120",
                    "PATH": f"{self.home}/.k0s-fleet/bin:{bindir}:/usr/local/bin:/usr/bin:/bin"}
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(f"# {text}")
        print(f"# {text}", flush=True)

    def sh(self, cmd: str, *, cwd: Path | None = None, timeout: float = 600,
           ok: tuple[int, ...] = (0,), clean: bool = True) -> str:
        """``clean=False``: in this process's environment (the checkout's build step)."""
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-c", cmd], cwd=cwd or self.work,
                              env=self.env if clean else dict(os.environ),
                              capture_output=True, text=True, timeout=timeout, check=False)
        took = time.monotonic() - t0
        out = (proc.stdout + proc.stderr).rstrip("\n")
        shown = f"$ {cmd}\n{out}" if out else f"$ {cmd}"
        if proc.returncode:
            shown += f"\n[exit {proc.returncode}]"
        self.lines.append(shown)
        print(shown, f"\n({took:.1f}s)", flush=True)
        if proc.returncode not in ok:
            raise RuntimeError(f"{cmd!r} exited {proc.returncode}")
        return out

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@contextlib.contextmanager
def process(args: list[str], log: Path, **kw: Any) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, **kw)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


async def wait_http(url: str, timeout: float) -> None:
    async with aiohttp.ClientSession() as s:
        with anyio.fail_after(timeout):
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(url) as r:
                        if r.status == 200:
                            return
                await anyio.sleep(0.5)


async def wait_alert(prom: str, alert: str, timeout: float) -> None:
    async with aiohttp.ClientSession() as s:
        with anyio.fail_after(timeout):
            while True:
                async with s.get(f"{prom}/api/v1/alerts") as r:
                    alerts = (await r.json())["data"]["alerts"]
                if any(a["labels"]["alertname"] == alert and a["state"] == "firing"
                       for a in alerts):
                    return
                await anyio.sleep(5)


async def wait_no_alert(prom: str, timeout: float) -> None:
    async with aiohttp.ClientSession() as s:
        with anyio.fail_after(timeout):
            while True:
                async with s.get(f"{prom}/api/v1/alerts") as r:
                    if not (await r.json())["data"]["alerts"]:
                        return
                await anyio.sleep(5)


@contextlib.asynccontextmanager
async def test_world(work: Path) -> AsyncIterator[World]:
    world = World(["mgmt", "wl1", "wl2"], workdir=work / "world")
    await anyio.to_thread.run_sync(world.start)
    try:
        await world.install_crds()
        yield world
    finally:
        await anyio.to_thread.run_sync(world.close)


async def fleet(world: World, mgmt: KubeClient
                ) -> tuple[list[NodeResponder], list[KubeClient]]:
    """Two clusters (edge-01 the canary), 1 control plane + 2 workers each, nodes scripted;
    edge-02's first worker fails its download."""
    await ensure_infra_crd(mgmt)
    await mgmt.create(NAMESPACES, {"metadata": {"name": FLEET_NS}})
    responders = []
    clients = []
    for server, name, ring in (("wl1", "edge-01", "canary"), ("wl2", "edge-02", "production")):
        wl = await world[server].client()
        clients.append(wl)
        fc = await create_cluster(mgmt, wl, world[server].kubeconfig(), namespace=FLEET_NS,
                                  name=name, version=FROM, control_planes=1, workers=2,
                                  max_unavailable=1)
        await mgmt.patch(CLUSTERS, name, {"metadata": {"labels": {RING: ring}}}, FLEET_NS)
        behaviours = {fc.workers[0]: Behaviour(fail_at=SignalState.DOWNLOADING)} \
            if name == "edge-02" else {}
        responders.append(NodeResponder(wl, step_seconds=0.5, behaviours=behaviours))
    return responders, clients


async def run(work: Path, out: Path | None, alert_timeout: float) -> int:
    async with test_world(work) as world, ReleaseServer() as releases:
        releases.add(FROM)
        new = releases.add(TO)
        mgmt = await world["mgmt"].client()
        responders, clients = await fleet(world, mgmt)
        kubeconfig = world["mgmt"].write_kubeconfig(work / "kubeconfig")
        t = Transcript(work, kubeconfig)

        async def sh(cmd: str, **kw: Any) -> str:
            # in a thread: the scripted nodes answer on this event loop meanwhile
            return await anyio.to_thread.run_sync(functools.partial(t.sh, cmd, **kw))

        metrics_port, prom_port = free_port(), free_port()
        async with anyio.create_task_group() as tg:
            for r in responders:
                await tg.start(r.run)
            t.note("from a checkout of the repository: build what gets installed")
            await sh(f"make -s dist DIST={work}/dist", cwd=REPO_ROOT, clean=False)
            t.note("a clean shell: HOME, PATH and KUBECONFIG (the management cluster) only")
            await sh("env | sort")
            await sh("python3 -m venv ~/.k0s-fleet && ~/.k0s-fleet/bin/pip install -q "
                 "dist/k0s_fleet-0.1.0-py3-none-any.whl", timeout=900)
            await sh("k0s-fleet --version")
            await sh("kubectl get clusters -A -L k0s-fleet.io/ring")
            values = {"fleet": {
                "clusters": {"namespaces": [FLEET_NS]},
                "download": {"urlTemplate": releases.base_url + "/k0s/{version}?arch={arch}",
                             "digests": {TO: {"amd64": new.sha256}}},
                "rollout": {"waves": [
                    {"name": "canary", "canary": True, "soakSeconds": "30s",
                     "clusterSelector": {"matchLabels": {RING: "canary"}}},
                    {"name": "production", "failureBudget": 0,
                     "clusterSelector": {"matchLabels": {RING: "production"}}}]},
            }}
            await sh("cat > fleet-values.yaml <<'EOF'\n" + yaml.safe_dump(values, sort_keys=False)
                 + "EOF")
            await sh(f"helm install k0s-fleet dist/k0s-fleet-0.1.0.tgz --namespace {SYSTEM_NS} "
                 "--create-namespace --values fleet-values.yaml")
            # The pod the Deployment would run: the chart's fleet YAML, out of cluster.
            cm = await mgmt.get(CONFIGMAPS, "k0s-fleet", SYSTEM_NS)
            config = yaml.safe_load(cm["data"]["fleet.yaml"])
            config["management"] = {"namespace": SYSTEM_NS, "kubeconfig": str(kubeconfig)}
            config["status"] = {**config.get("status", {}), "port": metrics_port}
            (work / "controller.yaml").write_text(yaml.safe_dump(config))
            rules = (await anyio.run_process(
                [str(binary("helm")), "template", "k0s-fleet",
                 str(work / "dist" / "k0s-fleet-0.1.0.tgz"),
                 "--namespace", SYSTEM_NS, "--set", "metrics.prometheusRule.enabled=true",
                 "--set", f"fleet.clusters.namespaces[0]={FLEET_NS}",  # as installed
                 "--api-versions", "monitoring.coreos.com/v1",
                 "--show-only", "templates/prometheusrule.yaml"])).stdout.decode()
            (work / "rules.yaml").write_text(yaml.safe_dump(
                {"groups": yaml.safe_load(rules)["spec"]["groups"]}))
            (work / "prometheus.yaml").write_text(yaml.safe_dump({
                "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
                "rule_files": ["rules.yaml"],
                "scrape_configs": [{"job_name": "k0s-fleet", "static_configs": [{
                    "targets": [f"127.0.0.1:{metrics_port}"],
                    "labels": {"namespace": SYSTEM_NS, "pod": "k0s-fleet-0"}}]}]}))
            with process([sys.executable, "-m", "fleet.cli", "controller", "--config",
                          str(work / "controller.yaml"), "--no-leader-elect"],
                         work / "controller.log", cwd=REPO_ROOT), \
                    process([str(binary("prometheus")), "--config.file=prometheus.yaml",
                             f"--storage.tsdb.path={work / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            work / "prometheus.log", cwd=work):
                t.note("(test world: no kubelet runs the Deployment's pod; the same "
                       "controller runs as a local process with the chart's fleet YAML, "
                       f"serving /metrics on :{metrics_port}, scraped by a Prometheus with "
                       f"the chart's rules on :{prom_port})")
                await wait_http(f"http://127.0.0.1:{metrics_port}/readyz", 120)
                await wait_http(f"http://127.0.0.1:{prom_port}/-/ready", 60)
                await sh("k0s-fleet plan")
                await sh(f"k0s-fleet upgrade --dry-run {TO}", ok=(0, 1))
                await sh(f"k0s-fleet upgrade {TO} --timeout 4m", ok=(0, 1, 3), timeout=400)
                await sh("k0s-fleet status -o wide --once", ok=(0, 1))
                await sh("kubectl get nodeplans -A", ok=(0, 1))
                await sh(f"kubectl -n {FLEET_NS} get events.events.k8s.io "
                     "--field-selector reason=NodeUpgradeFailed", ok=(0, 1))
                t.note("... the alert's `for` (5m) later:")
                await wait_alert(f"http://127.0.0.1:{prom_port}", "K0sFleetNodeUpgradeFailed",
                                 alert_timeout)
                await sh(f"curl -s localhost:{prom_port}/api/v1/alerts | jq '.data.alerts[] "
                     "| select(.state == \"firing\") | {alert: .labels.alertname, "
                     "severity: .labels.severity, summary: .annotations.summary, "
                     "runbook: .annotations.runbook_url}'")
                # the runbook: read why, fix the cause (here: the scripted node now
                # succeeds), retry the owner, follow the upgrade to the end
                responders[1].behaviours.clear()
                await sh(f"kubectl -n {FLEET_NS} get nodeplans -o wide")
                await sh(f"kubectl -n {FLEET_NS} annotate machinedeployment edge-02-md "
                         'fleet.k0s-fleet.io/retry="$(date +%s)" --overwrite')
                await sh(f"k0s-fleet upgrade {TO} --timeout 4m", ok=(0, 1, 3), timeout=400)
                t.note("... and once the alert's expression is false again, it resolves:")
                await wait_no_alert(f"http://127.0.0.1:{prom_port}", alert_timeout)
                await sh(f"curl -s localhost:{prom_port}/api/v1/alerts | jq '.data.alerts "
                         "| length'")
            tg.cancel_scope.cancel()
        for c in (mgmt, *clients):
            await c.close()
    if out is not None:
        await anyio.Path(out).write_text(t.text())
    print(json.dumps({"transcript": str(out) if out else None, "workdir": str(work)}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--workdir", type=Path)
    p.add_argument("--alert-timeout", type=float, default=600)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="k0s-fleet-first-hour-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    return anyio.run(run, work, args.out, args.alert_timeout)


if __name__ == "__main__":
    sys.exit(main())
