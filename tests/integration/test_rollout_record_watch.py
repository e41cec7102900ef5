"""The rollout ConfigMap served from a watch (fleet.rollout.coordinator), on a real
kube-apiserver: no GET per pass, a change someone else made is seen (and announced),
and admission stays a compare-and-swap when the copy a decision was made from trails the
API server.
"""

from __future__ import annotations

import dataclasses
import logging

import anyio
import anyio.abc
import pytest

from fleet.config.models import FleetConfig
from fleet.events import EventRecorder, list_events
from fleet.kube import KubeClient
from fleet.kube.resources import CONFIGMAPS
from fleet.rollout.annotations import ANN_PAUSED, ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.coordinator import RolloutCoordinator
from fleet.rollout.gate import FleetView
from fleet.rollout.state import RolloutState
from tests.helpers.gate import T0, cluster

pytestmark = pytest.mark.anyio


async def _until(what: str, check: object, timeout: float = 60.0) -> None:
    with anyio.fail_after(timeout):
        while not check():  # type: ignore[operator]
            await anyio.sleep(0.05)


async def _watching(tg: anyio.abc.TaskGroup, c: RolloutCoordinator,
                    on_change: object = None) -> None:
    tg.start_soon(lambda: c.watch(on_change))  # type: ignore[arg-type]
    await _until("watch synced", lambda: c._record is not None and c._record.synced.is_set())


async def test_reads_come_from_the_watch_and_see_other_writers(
        mgmt: KubeClient, namespace: str) -> None:
    """Once the ConfigMap exists and the watch has it, passes read it without a GET; a
    pause annotation set by someone else reaches the next read and calls on_change."""
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace}})
    c = RolloutCoordinator(mgmt, cfg)
    pokes: list[int] = []
    async with anyio.create_task_group() as tg:
        await _watching(tg, c, lambda: pokes.append(1))
        await c.read()  # not there yet: GET, then created
        assert c.gets == 1
        await _until("the watch has it", lambda: c._watched() is not None)
        d = await c.decide([cluster("c0")], T0)  # admits c0: a record write of our own
        assert d.admitted_now == {("fleet", "c0")}
        for _ in range(20):
            await c.decide([cluster("c0")], T0)
        assert c.gets == 1, "every read after the first came from the watch"
        await _until("our own write's event arrived", lambda: c._record is not None and (
            c._record.get(ROLLOUT_CONFIGMAP, namespace) or {}).get("metadata", {}).get(
            "resourceVersion") == c._configmap["metadata"]["resourceVersion"])  # type: ignore[index]
        before = len(pokes)
        await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP,
                         {"metadata": {"annotations": {ANN_PAUSED: "maintenance"}}}, namespace)
        await _until("announced", lambda: len(pokes) > before)
        controls, _ = await c.read()
        assert controls.paused == "maintenance"
        assert c.gets == 1
        tg.cancel_scope.cancel()
    await c.read()  # no watch running: a GET again
    assert c.gets == 2


async def test_admission_from_a_trailing_copy_is_withdrawn(
        mgmt: KubeClient, namespace: str) -> None:
    """maxConcurrentClusters 1, two replicas watching the record. b decides from its
    watched copy; a admits its cluster first; b's write carries the resourceVersion of
    the copy it decided from, gets a real 409, re-reads and withdraws. Once b's watch has
    a's record, b admits nothing."""
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace},
                                      "rollout": {"maxConcurrentClusters": 1}})
    mine_a = [cluster("c0"), dataclasses.replace(cluster("c1"), foreign=True)]
    mine_b = [dataclasses.replace(cluster("c0"), foreign=True), cluster("c1")]
    a, b = RolloutCoordinator(mgmt, cfg), RolloutCoordinator(mgmt, cfg)
    async with anyio.create_task_group() as tg:
        await _watching(tg, a)
        await _watching(tg, b)
        await a.read()  # creates the ConfigMap
        await _until("b's watch has it", lambda: b._watched() is not None)
        gets = b.gets
        controls, state = await b.read()  # b decides from its watched copy ...
        assert b.gets == gets
        da = await a.decide(mine_a, T0)  # ... while a admits its cluster first
        assert da.admitted_now == {("fleet", "c0")}
        stale = b.gate.evaluate(FleetView(mine_b, controls, state), T0)
        assert stale.admitted_now == {("fleet", "c1")}  # alone, b would admit c1 too
        assert not await b.write(stale)  # 409, re-read: the record moved; nothing written
        cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
        assert RolloutState.from_json(cm["data"][STATE_KEY]).admitted.keys() == {"fleet/c0"}

        def b_sees_a() -> bool:
            seen = b._watched()
            return seen is not None and "fleet/c0" in RolloutState.from_json(
                (seen.get("data") or {}).get(STATE_KEY)).admitted
        await _until("b's copy has a's admission", b_sees_a)
        db = await b.decide(mine_b, T0)
        assert db.admitted_now == frozenset() and db.allowed_clusters == frozenset()
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("record", ["{not json", '{"waves": [1, 2], "admitted": {}}',
                                    '["a list"]', '{"admitted": "fleet/c9"}'])
async def test_an_unreadable_record_fails_closed(mgmt: KubeClient, namespace: str,
                                                 record: str) -> None:
    """Issue #30: an unreadable record used to be read as empty (its admissions silently
    lost, then written over), and one of the wrong shape raised in every pass. Now nothing
    new is admitted, the record is left as it is, the reason is named in the decision and
    in a Warning Event, and the pass goes on; once the record is fixed, admission resumes."""
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace}})
    await mgmt.create(CONFIGMAPS, {"metadata": {"name": ROLLOUT_CONFIGMAP,
                                                "namespace": namespace},
                                   "data": {STATE_KEY: record}}, namespace)
    c = RolloutCoordinator(mgmt, cfg, recorder=EventRecorder(mgmt, instance="test",
                                                                default_namespace=namespace))
    d = await c.decide([cluster("c0")], T0)
    assert d.admitted_now == set() and ("fleet", "c0") not in d.allowed_clusters
    assert "no new cluster is admitted" in d.reasons[("fleet", "c0")]
    cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
    assert cm["data"][STATE_KEY] == record  # not written over
    events = await list_events(mgmt, namespace)
    assert any(e.get("reason") == "RolloutRecordUnreadable" and e.get("type") == "Warning"
               for e in events), events
    # fixed by the operator: admission resumes
    await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP,
                     {"data": {STATE_KEY: RolloutState().to_json()}}, namespace)
    d = await c.decide([cluster("c0")], T0)
    assert d.admitted_now == {("fleet", "c0")}


async def test_each_admission_and_its_end_is_logged_with_what_it_was_decided_from(
        mgmt: KubeClient, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace},
                                      "rollout": {"maxConcurrentClusters": 1}})
    c = RolloutCoordinator(mgmt, cfg)
    with caplog.at_level(logging.INFO, logger="fleet.rollout.coordinator"):
        d = await c.decide([cluster("c0"), cluster("c1")], T0)
        assert d.admitted_now == {("fleet", "c0")}
        d = await c.decide([cluster("c0", "u"), cluster("c1")], T0)  # c0 done, c1 next
        assert d.admitted_now == {("fleet", "c1")}
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("admitted fleet/c0 in wave default") and m.endswith(
        "admitted before: none") for m in lines), lines
    assert any(m.startswith("admission of fleet/c0 dropped (Complete") for m in lines), lines
    assert any(m.startswith("admitted fleet/c1 in wave default") and "fleet/c0" in m
               for m in lines), lines
