"""UpdateMachine's checks (fleet.extension.admission): the request is a hint; pure."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.contract.skew import (
    RULE_NO_DOWNGRADE,
    RULE_ONE_MINOR_AT_A_TIME,
    RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER,
    RULE_WORKERS_NOT_NEWER,
)
from fleet.contract.versions import K0sVersion
from fleet.extension.admission import (
    CHECK_EXTENSION_PATH,
    CHECK_FLEET_TARGET,
    CHECK_IN_PLACE,
    CHECK_LIVE_VERSION,
    PENDING_HOOKS_ANNOTATION,
    UPDATE_IN_PROGRESS_ANNOTATION,
    UpdateSubject,
    check_cluster_skew,
    check_update_machine,
    in_place_update_in_progress,
    pending_hooks,
    refusal_message,
)

OLD, NEW = "v1.31.3+k0s.0", "v1.32.1+k0s.0"
MARKED = {UPDATE_IN_PROGRESS_ANNOTATION: "", PENDING_HOOKS_ANNOTATION: "UpdateMachine"}


def machine(version: str | None = NEW, annotations: dict[str, str] | None = None
            ) -> dict[str, Any]:
    return {"metadata": {"name": "m1", "namespace": "ns",
                         "annotations": MARKED if annotations is None else annotations},
            "spec": {"clusterName": "c1", "version": version}}


def subject(**kw: Any) -> UpdateSubject:
    base: dict[str, Any] = {
        "requested": NEW, "machine": machine(), "role": "worker", "drives": True,
        "owner_kind": "MachineDeployment", "owner_name": "md-0", "owner_found": True,
        "owner_target": NEW, "node_version": OLD, "control_planes": (NEW,),
        "workers": ()}
    base.update(kw)
    return UpdateSubject(**base)


def checks(s: UpdateSubject) -> list[str]:
    return [r.check for r in check_update_machine(s)]


def test_what_cluster_api_does_passes() -> None:
    assert check_update_machine(subject()) == []
    # the node already on the version (a repeated call) is no move at all
    assert check_update_machine(subject(node_version=NEW)) == []
    # control plane unknown (hosted elsewhere, not reported): not a refusal here
    assert check_update_machine(subject(control_planes=())) == []


def test_the_in_place_markers() -> None:
    assert in_place_update_in_progress(machine())
    assert pending_hooks({PENDING_HOOKS_ANNOTATION: "BeforeClusterUpgrade, UpdateMachine"}) == [
        "BeforeClusterUpgrade", "UpdateMachine"]
    assert not in_place_update_in_progress(machine(annotations={}))
    # marked, but the hook is not (yet, or any more) pending: CAPI does not call now
    assert not in_place_update_in_progress(machine(annotations={
        UPDATE_IN_PROGRESS_ANNOTATION: ""}))
    assert not in_place_update_in_progress(machine(annotations={
        UPDATE_IN_PROGRESS_ANNOTATION: "", PENDING_HOOKS_ANNOTATION: "UpdateMachineX"}))
    assert not in_place_update_in_progress(machine(annotations={
        PENDING_HOOKS_ANNOTATION: "UpdateMachine"}))


def test_each_check_names_itself() -> None:
    assert checks(subject(drives=False)) == [CHECK_EXTENSION_PATH]
    assert checks(subject(machine=machine(annotations={}))) == [CHECK_IN_PLACE]
    assert checks(subject(machine=machine(OLD))) == [CHECK_LIVE_VERSION]
    assert checks(subject(owner_kind="", owner_name="")) == [CHECK_FLEET_TARGET]
    assert checks(subject(owner_found=False)) == [CHECK_FLEET_TARGET]
    assert checks(subject(owner_target=None)) == [CHECK_FLEET_TARGET]
    assert checks(subject(owner_target=OLD)) == [CHECK_FLEET_TARGET]


def test_skew_rules_on_what_the_node_runs() -> None:
    down = subject(requested=OLD, machine=machine(OLD), owner_target=OLD, node_version=NEW)
    assert checks(down) == [RULE_NO_DOWNGRADE]
    skip = "v1.33.0+k0s.0"
    two = subject(requested=skip, machine=machine(skip), owner_target=skip,
                  control_planes=(skip,))
    assert checks(two) == [RULE_ONE_MINOR_AT_A_TIME]
    # a worker never on a newer minor than the oldest control plane
    ahead = subject(control_planes=(NEW, OLD))
    assert checks(ahead) == [RULE_WORKERS_NOT_NEWER]
    # a control plane never more than one minor ahead of the oldest worker
    cp = subject(role="controller", owner_kind="K0sControlPlane", owner_name="cp",
                 control_planes=(), node_version="v1.32.0+k0s.0",
                 requested="v1.33.0+k0s.0", machine=machine("v1.33.0+k0s.0"),
                 owner_target="v1.33.0+k0s.0", workers=("v1.31.9+k0s.0", "v1.32.0+k0s.0"))
    assert checks(cp) == [RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER]


def test_the_attack_is_refused_on_every_count() -> None:
    """A forged request: a downgrade for a Machine Cluster API is not updating, on a
    cluster not on the extension path, with no fleet target: every failed check is named
    in the one message."""
    s = subject(requested="v1.30.1+k0s.0", machine=machine(OLD, annotations={}),
                drives=False, owner_target=OLD, node_version=OLD)
    refusals = check_update_machine(s)
    assert [r.check for r in refusals] == [CHECK_EXTENSION_PATH, CHECK_IN_PLACE,
                                           CHECK_LIVE_VERSION, CHECK_FLEET_TARGET,
                                           RULE_NO_DOWNGRADE]
    msg = refusal_message(s.what, refusals)
    assert msg.startswith("Machine ns/m1: refused by k0s-fleet: ExtensionPath: ")
    for needle in ("v1.30.1+k0s.0", "spec.version v1.31.3+k0s.0", "NoDowngrade"):
        assert needle in msg, msg


versions = st.builds(lambda a, b, c: f"v1.{a}.{b}+k0s.{c}", st.integers(28, 36),
                     st.integers(0, 5), st.integers(0, 2))


@settings(max_examples=400)
@given(requested=versions, live=versions, target=versions, node=st.none() | versions,
       cps=st.lists(versions, max_size=3), drives=st.booleans(), marked=st.booleans())
def test_property_acts_only_when_every_fact_agrees(  # noqa: PLR0917
        requested: str, live: str, target: str, node: str | None, cps: list[str],
        drives: bool, marked: bool) -> None:
    """Independent restatement: no refusal exactly when the cluster is on the path, the
    Machine is marked, live version = requested = target, and against the node and the
    control planes the move is up (or none) by at most one minor and not past the oldest
    control plane's minor."""
    s = subject(requested=requested, machine=machine(live, None if marked else {}),
                owner_target=target, node_version=node, control_planes=tuple(cps),
                drives=drives)
    r, lv, t = (K0sVersion.parse(v) for v in (requested, live, target))
    ok = drives and marked and lv == r and t == r
    if node is not None:
        n = K0sVersion.parse(node)
        ok = ok and r >= n and r.minor - n.minor <= 1
    if cps:
        ok = ok and r.minor <= min(K0sVersion.parse(c) for c in cps).minor
    refusals = check_update_machine(s)
    assert (refusals == []) == ok, refusals
    assert all(r.message for r in refusals)


def test_cluster_skew_for_can_update() -> None:
    def rule(role: str, desired: str, cps: tuple[str, ...], ws: tuple[str, ...]) -> str | None:
        r = check_cluster_skew(role, desired, cps, ws, what="c")
        return r.rule if r else None

    assert rule("worker", NEW, (OLD,), ()) == RULE_WORKERS_NOT_NEWER
    assert rule("worker", NEW, (NEW, "v1.32.0+k0s.0"), ()) is None
    assert rule("worker", NEW, (), ()) is None  # control plane not known: not refused here
    assert rule("controller", "v1.33.0+k0s.0", (), (OLD,)) == \
        RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER
    assert rule("controller", NEW, (), (OLD,)) is None
