"""A real Prometheus scrapes a real ``k0s-fleet controller`` process during a failing
rollout, evaluates the chart's PrometheusRule, and the alert fires.

Prometheus is the pinned release `make testenv` builds (``PROMETHEUS_VERSION``); the rules
are the chart's, rendered by helm for the test's namespace, with one override in the
rule file: evaluated every second and ``for: 2s`` instead of minutes (what is under test
is the expression against real metrics, and that Prometheus loads and fires it). The
scrape adds the ``namespace`` label a ServiceMonitor would. The node side is the
scripted responder failing the node's download, so the NodePlan ends Failed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import pytest
import yaml

from fleet import __version__
from fleet.contract.signal import SignalState
from fleet.kube import KubeClient
from fleet.testing.binaries import REPO_ROOT, binary
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd
from fleet.testing.responder import Behaviour, NodeResponder
from fleet.testing.world import World, free_port
from tests.helpers.charts import CONTROLLER_CHART, render
from tests.helpers.controller import V2, fleet_config_dict
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

ALERT = "K0sFleetNodeUpgradeFailed"


def rule_file(namespace: str) -> dict[str, Any]:
    """The chart's rule groups, evaluated every second, each ``for`` 2s."""
    rule = render(CONTROLLER_CHART, sets=("metrics.prometheusRule.enabled=true",),
                  namespace=namespace).one("PrometheusRule")
    groups = rule["spec"]["groups"]
    for g in groups:
        g["interval"] = "1s"
        for r in g["rules"]:
            if "for" in r:
                r["for"] = "2s"
    return {"groups": groups}


class Prometheus:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def query(self, promql: str) -> list[dict[str, Any]]:
        async with self.session.get(f"{self.url}/api/v1/query",
                                    params={"query": promql}) as r:
            body = await r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    async def wait_for(self, promql: str, timeout: float) -> list[dict[str, Any]]:
        """The query's result once it is not empty (polled, within ``timeout``)."""
        with anyio.fail_after(timeout):
            while True:
                result = await self.query(promql)
                if result:
                    return result
                await anyio.sleep(0.5)


@pytest.fixture
async def processes() -> AsyncIterator[list[anyio.abc.Process]]:
    started: list[anyio.abc.Process] = []
    yield started
    for proc in reversed(started):
        if proc.returncode is None:
            proc.terminate()
            with anyio.fail_after(20):
                await proc.wait()


async def test_prometheus_fires_the_charts_alert_on_a_failing_rollout(  # noqa: PLR0917
        mgmt: KubeClient, wl2: KubeClient, crds_installed: World, namespace: str,
        tmp_path: Path, processes: list[anyio.abc.Process]) -> None:
    await ensure_infra_crd(mgmt)
    fc = await create_cluster(mgmt, wl2, crds_installed["wl2"].kubeconfig(),
                              namespace=namespace, name=unique("prom"), control_planes=0,
                              workers=1, max_unavailable=1)
    node = fc.workers[0]
    responder = NodeResponder(wl2, step_seconds=0.02, only=lambda n: n == node,
                              behaviours={node: Behaviour(fail_at=SignalState.DOWNLOADING)})

    # the controller, as its own process, with its status/metrics endpoint
    metrics_port, prom_port = free_port(), free_port()
    config = fleet_config_dict(namespace)
    config["management"]["kubeconfig"] = str(
        crds_installed["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml"))
    config["status"] = {"port": metrics_port}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_file(namespace)))
    (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [{
            "job_name": "k0s-fleet",
            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"],
                                "labels": {"namespace": namespace, "pod": "controller-0"}}],
        }],
    }))
    controller_log = (tmp_path / "controller.log").open("wb")
    prometheus_log = (tmp_path / "prometheus.log").open("wb")
    processes.append(await anyio.open_process(
        [sys.executable, "-m", "fleet.cli", "controller", "--config",
         str(tmp_path / "fleet.yaml"), "--no-leader-elect"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=controller_log))
    processes.append(await anyio.open_process(
        [str(binary("prometheus")), "--config.file=prometheus.yaml",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=prometheus_log))

    async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
        await tg.start(responder.run)
        prom = Prometheus(f"http://127.0.0.1:{prom_port}", session)
        with anyio.fail_after(60):
            while True:
                try:
                    async with session.get(f"{prom.url}/-/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await anyio.sleep(0.2)
        # the controller is scraped and has planned the healthy fleet: its node is
        # counted UpToDate, nothing Failed, so the alert is not even pending
        sel = f'namespace="{namespace}"'
        await prom.wait_for(f'k0s_fleet_nodes{{{sel},state="UpToDate"}} == 1', timeout=60)
        assert await prom.query(f'k0s_fleet_nodes{{{sel},state="Failed"}} > 0') == []
        assert await prom.query(f'ALERTS{{alertname="{ALERT}"}}') == []
        # the process, GC and build metrics come from the real process
        (info,) = await prom.query(f"k0s_fleet_build_info{{{sel}}}")
        assert info["metric"]["version"] == __version__
        assert info["metric"]["component"] == "controller"
        for name in ("process_start_time_seconds", "process_resident_memory_bytes",
                     "process_open_fds", "python_gc_collections_total",
                     "python_gc_pause_seconds_total"):
            assert await prom.query(f"{name}{{{sel}}}"), name

        # the rollout: the node fails its download, the NodePlan ends Failed
        await bump(mgmt, fc, V2)
        (firing,) = await prom.wait_for(
            f'ALERTS{{alertname="{ALERT}",alertstate="firing",{sel}}}', timeout=120)
        assert firing["metric"]["severity"] == "warning"
        async with session.get(f"{prom.url}/api/v1/alerts") as r:
            alerts = (await r.json())["data"]["alerts"]
        (alert,) = [a for a in alerts if a["labels"]["alertname"] == ALERT]
        assert alert["state"] == "firing"
        assert alert["annotations"]["summary"] == \
            "k0s-fleet: 1 node upgrade(s) failed (NodePlan phase Failed)"
        assert alert["annotations"]["runbook_url"].endswith(
            "/docs/operations.md#recover-from-a-failed-node")
        tg.cancel_scope.cancel()
    controller_log.close()
    prometheus_log.close()
