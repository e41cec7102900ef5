"""UpdateMachine answers from NodePlan status and the Node: pure, exhaustive where cheap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import FAILED_STATES, HAPPY_PATH, RUNNING_VERSION_KEY, SignalState
from fleet.extension.progress import (
    DEFAULT_RETRY_SECONDS,
    RETRY_AFTER_SECONDS,
    UNOBSERVABLE_RETRY_SECONDS,
    NodeObservation,
    observe_node,
    update_progress,
)
from fleet.extension.wire import ResponseStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hooks"
V = "v1.32.1+k0s.0"


def plan(phase: str = "Pending", node_state: str = "", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "m1-v1.32.1-k0s.0", "namespace": "fleet-prod"},
            "spec": {"version": V, "nodeName": "m1"},
            "status": {"phase": phase, "nodeState": node_state, **status}}


READY = NodeObservation(name="m1", ready=True, running_version=V, architecture="amd64")


def test_retry_after_follows_the_phase_not_a_flat_value() -> None:
    seen = {}
    for state in HAPPY_PATH[:-1]:
        r = update_progress(plan("InProgress", state), READY, V)
        assert r.status is ResponseStatus.SUCCESS and r.retry_after_seconds > 0
        seen[state] = r.retry_after_seconds
    assert seen[SignalState.DOWNLOADING] > seen[SignalState.APPLYING_UPDATE]
    assert len(set(seen.values())) >= 3
    assert 15 not in seen.values()
    assert update_progress(plan(), READY, V).retry_after_seconds == \
        RETRY_AFTER_SECONDS[NodePlanPhase.PENDING]
    assert update_progress(plan("SomethingNew"), READY, V).retry_after_seconds == \
        DEFAULT_RETRY_SECONDS


def test_a_custom_table_is_honoured() -> None:
    r = update_progress(plan("InProgress", "Downloading"), READY, V, table={"Downloading": 42})
    assert r.retry_after_seconds == 42


@pytest.mark.parametrize("state", sorted(FAILED_STATES))
def test_failed_node_states_fail_with_the_reason(state: SignalState) -> None:
    r = update_progress(plan("Failed", str(state), message="sha256 mismatch"), READY, V)
    assert r.status is ResponseStatus.FAILURE
    assert str(state) in r.message and "sha256 mismatch" in r.message
    assert "fleet-prod/m1-v1.32.1-k0s.0" in r.message


def test_a_nodeplan_being_deleted_is_waited_out() -> None:
    p = plan("Failed", "FailedDownload")
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    r = update_progress(p, READY, V)
    assert r.status is ResponseStatus.SUCCESS and r.retry_after_seconds > 0
    assert "being deleted" in r.message


def test_failed_condition_reason_is_preferred() -> None:
    p = plan("Failed", "", message="node went silent",
             conditions=[{"type": "Failed", "status": "True", "reason": "Timeout",
                          "lastTransitionTime": "2026-01-01T00:00:00Z"}])
    r = update_progress(p, READY, V)
    assert r.status is ResponseStatus.FAILURE
    assert "Timeout: node went silent" in r.message


def test_completed_needs_the_node_on_the_version_and_ready() -> None:
    done = update_progress(plan("Completed", "Completed"), READY, V)
    assert done.done and "Ready" in done.message
    not_ready = NodeObservation(name="m1", ready=False, running_version=V)
    r = update_progress(plan("Completed"), not_ready, V)
    assert r.retry_after_seconds == RETRY_AFTER_SECONDS[SignalState.COMPLETED]
    assert "NotReady" in r.message
    old = NodeObservation(name="m1", ready=True, running_version="v1.31.3+k0s.0")
    assert not update_progress(plan("Completed"), old, V).done
    gone = NodeObservation.missing("m1")
    assert not update_progress(plan("Completed"), gone, V).done
    blind = NodeObservation.unobservable("m1", "connection refused")
    r = update_progress(plan("Completed"), blind, V)
    assert r.retry_after_seconds == UNOBSERVABLE_RETRY_SECONDS
    assert "connection refused" in r.message
    # Spellings of the same release compare equal.
    spelled = NodeObservation(name="m1", ready=True, running_version="v1.32.1-k0s.0")
    assert update_progress(plan("Completed"), spelled, V).done


def test_without_a_workload_view_the_nodeplan_is_trusted() -> None:
    assert update_progress(plan("Completed", runningVersion=V), None, V).done
    assert update_progress(plan("Completed"), None, V).done
    r = update_progress(plan("Completed", runningVersion="v1.31.3+k0s.0"), None, V)
    assert not r.done and r.status is ResponseStatus.SUCCESS


@given(phase=st.text(max_size=20), node_state=st.text(max_size=20),
       ready=st.booleans(), running=st.sampled_from([None, V, "v1.31.3+k0s.0", "garbage"]))
def test_every_status_gets_a_well_formed_answer(phase: str, node_state: str, ready: bool,
                                                running: str | None) -> None:
    node = NodeObservation(name="m1", ready=ready, running_version=running)
    r = update_progress(plan(phase, node_state), node, V)
    wire = r.to_wire()
    assert wire["status"] in ("Success", "Failure")
    assert isinstance(wire["retryAfterSeconds"], int) and wire["retryAfterSeconds"] >= 0
    if r.status is ResponseStatus.FAILURE:
        assert wire["retryAfterSeconds"] == 0
    if r.done:
        assert ready and running == V


def test_observe_node() -> None:
    node: dict[str, Any] = {"metadata": {"name": "m1", "annotations": {RUNNING_VERSION_KEY: V},
                         "labels": {"kubernetes.io/arch": "arm64"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    o = observe_node("m1", node)
    assert o.runs(V) and o.architecture == "arm64"
    node["status"]["nodeInfo"] = {"architecture": "amd64"}
    node["status"]["conditions"][0]["status"] = "False"
    o = observe_node("m1", node)
    assert not o.runs(V) and o.architecture == "amd64"
    assert not observe_node("m1", None).found


@pytest.mark.parametrize("stem, p, node", [
    ("updatemachine-response-downloading", plan("InProgress", "Downloading"), READY),
    ("updatemachine-response-done", plan("Completed", "Completed"), READY),
    ("updatemachine-response-failed",
     plan("Failed", "FailedDownload", message="sha256 mismatch: got 3f2a..., want 9c1e..."),
     READY),
])
def test_update_machine_golden(stem: str, p: dict[str, Any], node: NodeObservation) -> None:
    got = update_progress(p, node, V).to_wire()
    assert got == json.loads((FIXTURES / f"{stem}.json").read_text())
