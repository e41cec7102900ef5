"""Status document, metrics, terminal view and the HTTP endpoints (no API server)."""

from __future__ import annotations

import dataclasses
import io
from datetime import timedelta
from typing import Any

import aiohttp
import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fleet.contract.nodeplan import NodePlanPhase
from fleet.planner import PlannerSettings, plan
from fleet.planner.incremental import Merger, split
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FleetControls
from fleet.status.health import Health
from fleet.status.metrics import FleetMetrics
from fleet.status.model import build_status
from fleet.status.server import StatusBoard, make_app, serve
from fleet.status.view import render
from fleet.world.model import NodePlanInfo, ObjectRef
from tests.helpers.gate import (
    CANARY,
    PROD,
    T0,
    cluster,
    evaluate,
    waves_config,
)


def _doc(**kw: object) -> dict:  # type: ignore[type-arg]
    cs = [cluster("can", "ug", labels=CANARY), cluster("p1", "ww", labels=PROD),
          cluster("p2", "uu", labels=PROD, object_annotation="hold")]
    d = evaluate(waves_config(), cs, **kw)  # type: ignore[arg-type]
    return build_status(d, cs)


def test_status_document_shape() -> None:
    doc = _doc()
    assert doc["rollout"]["phase"] == "Progressing"
    assert doc["summary"]["nodes"] == 6 and doc["summary"]["nodesUpToDate"] == 3
    assert doc["summary"]["nodesByState"]["Upgrading"] == 1
    assert [w["name"] for w in doc["waves"]] == ["canary", "prod", "default"]
    can = doc["waves"][0]["clusters"][0]
    assert can["phase"] == "Upgrading" and can["allowed"] and can["reason"] is None
    p1 = doc["waves"][1]["clusters"][0]
    assert not p1["allowed"] and "waiting for wave canary" in p1["reason"]
    assert p1["objects"][0]["nodes"][0]["state"] == "Waiting"
    assert doc["waves"][1]["soak"] == "10m"


def test_status_lists_halted_and_paused() -> None:
    cs = [cluster("can", "fw", labels=CANARY)]
    d = evaluate(waves_config(), cs, controls=FleetControls(paused="freeze"))
    doc = build_status(d, cs)
    assert doc["rollout"]["phase"] == "Halted"
    assert doc["haltedObjects"][0]["name"] == "can-md"
    assert "1 failed node upgrade" in doc["haltedObjects"][0]["reason"]
    assert doc["rollout"]["paused"] is not None


def test_terminal_view_renders_every_wave_and_reason() -> None:
    doc = _doc()
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render(doc))
    text = out.getvalue()
    for needle in ("wave canary", "wave prod", "fleet/p1", "waiting for wave canary",
                   "UpToDate:1", "3/6 nodes up to date"):
        assert needle in text, needle


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_follow_the_status_and_the_actions() -> None:
    reg = CollectorRegistry()
    m = FleetMetrics(reg)
    m.update_from_status(_doc())
    s = _samples(reg)
    assert s[("k0s_fleet_nodes", (("state", "UpToDate"),))] == 3
    assert s[("k0s_fleet_rollout_progress_ratio", ())] == 0.5
    assert s[("k0s_fleet_wave_phase", (("phase", "Progressing"), ("wave", "canary")))] == 1
    assert s[("k0s_fleet_rollout_phase", (("phase", "Progressing"),))] == 1
    ref = ObjectRef("NodePlan", "fleet", "m1-v1")
    old = NodePlanInfo(ref=ObjectRef("NodePlan", "fleet", "old"), cluster="c", machine="m0",
                       node="m0", role="worker", owner_kind="MachineDeployment",
                       owner_name="md", version="v1.31.3+k0s.0", started_at=T0,
                       phase=NodePlanPhase.COMPLETED, completed_at=T0)
    pending = NodePlanInfo(ref=ref, cluster="c", machine="m1", node="m1", role="worker",
                           owner_kind="MachineDeployment", owner_name="md",
                           version="v1.31.3+k0s.0")
    m.observe_nodeplans([old, pending])  # first sight: history is not counted
    t = T0 + timedelta(seconds=1)
    started = dataclasses.replace(pending, started_at=t, phase_since=t)
    down = dataclasses.replace(started, phase=NodePlanPhase.IN_PROGRESS,
                               node_state="Downloading", phase_since=t + timedelta(seconds=4))
    done = dataclasses.replace(down, phase=NodePlanPhase.COMPLETED, node_state="Completed",
                               phase_since=t + timedelta(seconds=64),
                               completed_at=t + timedelta(seconds=70))
    for snapshot in ([old, started], [old, started], [old, down], [old, done], [old, done]):
        m.observe_nodeplans(snapshot)  # repeated observations count once
    failed = dataclasses.replace(started, ref=ObjectRef("NodePlan", "fleet", "f"),
                                 phase=NodePlanPhase.FAILED, reason="ProgressDeadlineExceeded")
    m.observe_nodeplans([failed])
    s = _samples(reg)
    assert s[("k0s_fleet_node_upgrades_started_total", (("role", "worker"),))] == 2
    assert s[("k0s_fleet_node_upgrades_completed_total", ())] == 1
    assert s[("k0s_fleet_node_upgrades_failed_total", (("reason", "deadline"),))] == 1
    assert s[("k0s_fleet_node_phase_duration_seconds_sum", (("phase", "Pending"),))] == 4
    assert s[("k0s_fleet_node_phase_duration_seconds_sum", (("phase", "Downloading"),))] == 60
    assert s[("k0s_fleet_node_upgrade_duration_seconds_sum", ())] == 70
    # A wave that disappears from the config disappears from the metrics.
    doc = _doc()
    doc["waves"] = doc["waves"][:1]
    m.update_from_status(doc)
    assert not any(k[0] == "k0s_fleet_wave_phase" and ("wave", "prod") in k[1]
                   for k in _samples(reg))


def test_registries_are_independent() -> None:
    a, b = StatusBoard(), StatusBoard()
    a.metrics.progress.set(0.5)
    assert _samples(b.registry)[("k0s_fleet_rollout_progress_ratio", ())] == 0.0


@pytest.mark.anyio
async def test_http_endpoints() -> None:
    board = StatusBoard()
    ready = {"ok": False}
    health = Health()
    health.ready.add("caches", lambda: None if ready["ok"] else "not synced yet")
    health.live.add("loop", lambda: None)
    app = make_app(board, health=health)
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve(app, host="127.0.0.1", port=0,
                                                        task_status=task_status))
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/status") as r:
                assert r.status == 503
            async with s.get(f"{base}/readyz") as r:
                assert r.status == 503
                assert "caches: not synced yet" in await r.text()
            ready["ok"] = True
            async with s.get(f"{base}/readyz") as r:
                assert r.status == 200
            async with s.get(f"{base}/healthz") as r:
                assert r.status == 200
            cs = [cluster("can", "ug", labels=CANARY)]
            board.publish(evaluate(waves_config(), cs), cs)
            doc = board.status
            async with s.get(f"{base}/status") as r:
                assert r.status == 200
                assert await r.json() == doc
            async with s.get(f"{base}/metrics") as r:
                assert r.status == 200
                text = await r.text()
                assert 'k0s_fleet_nodes{state="UpToDate"} 1.0' in text
                assert r.headers["Content-Type"].startswith("text/plain")
        tg.cancel_scope.cancel()


def test_status_body_is_encoded_once_per_decision() -> None:
    """/status sends the document encoded once per decision (a 1000-cluster document
    costs a share of a second to encode on the controller's loop); a new decision is
    encoded anew."""
    import json  # noqa: PLC0415

    cs = [cluster("can", "ug", labels=CANARY), cluster("p1", "ww", labels=PROD)]
    board = StatusBoard(CollectorRegistry())
    assert board.status_body is None
    board.publish(evaluate(waves_config(), cs), cs)
    body = board.status_body
    assert body is not None and json.loads(body) == board.status
    assert b"\n" not in body and b'","' in body  # compact (the C encoder), not indented
    assert board.status_body is body  # the same bytes: not encoded again
    more = [*cs, cluster("p2", "uu", labels=PROD)]
    board.publish(evaluate(waves_config(), more), more)
    again = board.status_body
    assert again is not body and again is not None
    assert len(json.loads(again)["waves"][1]["clusters"]) == 2


def test_nodeplan_metrics_from_the_moved_parts_equal_those_from_every_nodeplan() -> None:
    """The board counts NodePlan transitions from the snapshot parts that are new since
    the last pass only (the same part object: none of its NodePlans moved); the counts
    equal those of a board that looks at every NodePlan on every pass."""
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i}", control_planes=1, workers=2) for i in range(4)]
    by_part, whole = StatusBoard(), StatusBoard()
    merger, cfg = Merger(), PlannerSettings(default_deadline=timedelta(hours=1))
    parts = split(sim.snapshot())
    for step in range(60):
        if step == 2:
            bump(sim, keys[1], "v1.31.3+k0s.0")
        if step == 5:
            bump(sim, keys[3], "v1.31.3+k0s.0")
        fresh = split(sim.snapshot())
        parts = {k: parts[k] if k in parts and parts[k] == p else p for k, p in fresh.items()}
        snap = merger.merge(parts, sim.now)
        by_part.observe_pass(snap)
        whole.observe_pass(dataclasses.replace(snap, parts=None))
        sim.apply_all(plan(sim.snapshot(), cfg).actions)
        for active in sim.active_requests()[:1]:
            sim.step_node(*active)
        sim.advance(1)
    def counts(board: StatusBoard) -> dict[Any, float]:
        return {k: v for k, v in _samples(board.registry).items()
                if not k[0].endswith("_created")}  # when the metric was made

    counted = counts(by_part)
    assert counted[("k0s_fleet_node_upgrades_completed_total", ())] == 6
    assert counted == counts(whole)


def test_wide_view_fits_120_columns_one_line_per_cluster() -> None:
    """First hour (#31): `status -o wide` wrapped every row at 120 columns. Each cluster
    stays on one line, its name whole; long cells are cut with an ellipsis."""
    cs = [cluster("edge-production-01", "ug", labels=CANARY), cluster("p1", "ww", labels=PROD),
          cluster("p2", "uu", labels=PROD, object_annotation="hold")]
    doc = build_status(evaluate(waves_config(), cs), cs)
    wide = {f"{c['namespace']}/{c['name']}": {
        "executor": "paused-in-place,capi-extension", "step": "Downloading",
        "node": "edge-production-01-md-7f9c4-abcde (+2)", "inStep": "1m02s"}
        for w in doc["waves"] for c in w["clusters"]}
    buf = io.StringIO()
    Console(file=buf, width=120).print(render(doc, wide=wide))
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 120, buf.getvalue()
    for name in wide:
        (row,) = [line for line in lines if name + " " in line]
        assert "Downloading" in row and "1m02s" in row, buf.getvalue()
    assert not [line for line in lines if "(+2)" in line and "fleet/" not in line]
    headers = [line for line in lines if " cluster " in line]
    assert headers and all("in step" in h and "why not now" in h for h in headers), headers
    assert "…" in buf.getvalue()
    # the bar under the headline ends its line (the first wave's panel began on it)
    assert lines[1].strip().strip("━╸") == "", lines[1]
