"""fleet.testing.rollcheck: the bench's independent rollout check finds each breach."""

from __future__ import annotations

from fleet.testing.rollcheck import NodeRun, Topology, check, handoffs, max_overlap

NODES = [("a-cp-0", True), ("a-cp-1", True), ("a-md-0", False), ("a-md-1", False)]


def topo(**kw: object) -> Topology:
    base: dict[str, object] = {
        "waves": ["canary", "default"], "wave_of": {"a": "canary", "b": "default"},
        "nodes": {"a": NODES, "b": [(n.replace("a-", "b-"), cp) for n, cp in NODES]},
        "max_unavailable": 1, "max_concurrent": {"canary": 1, "default": 1}}
    base.update(kw)
    return Topology(**base)  # type: ignore[arg-type]


def serial(cluster: str, start: float) -> list[NodeRun]:
    """One node after another, each 1 s, touching (completion == next request)."""
    return [NodeRun(cluster, n.replace("a-", f"{cluster}-"), f"p-{n}", start + i, start + i + 1)
            for i, (n, _) in enumerate(NODES)]


def test_a_clean_serial_rollout_has_no_violation() -> None:
    v = check(serial("a", 0) + serial("b", 4), {}, topo())
    assert v.violations == [] and v.not_completed == []
    assert v.max_clusters_at_once == {"canary": 1, "default": 1}


def test_touching_intervals_do_not_overlap_but_crossing_ones_do() -> None:
    assert max_overlap([(0, 1), (1, 2)]) == (1, 0)
    assert max_overlap([(0, 1.5), (1, 2)]) == (2, 1)


def test_two_plans_for_one_node_is_double_dispatch() -> None:
    runs = [*serial("a", 0), NodeRun("a", "a-md-1", "second", 10, 11)]
    v = check(runs, {}, topo(nodes={"a": NODES}))
    assert len(v.double_dispatch) == 1 and "a-md-1" in v.double_dispatch[0]


def test_two_distinct_signals_for_one_plan_is_double_dispatch() -> None:
    v = check(serial("a", 0), {("a", "a-md-0"): 2}, topo(nodes={"a": NODES}))
    assert v.double_dispatch == ["a/a-md-0: 2 distinct requests for one plan"]


def test_two_workers_at_once_breach_max_unavailable_and_two_cps_quorum() -> None:
    runs = [NodeRun("a", "a-cp-0", "1", 0, 2), NodeRun("a", "a-cp-1", "2", 1, 3),
            NodeRun("a", "a-md-0", "3", 4, 6), NodeRun("a", "a-md-1", "4", 5, None)]
    v = check(runs, {}, topo(nodes={"a": NODES}))
    assert len(v.budget) == 1 and len(v.quorum) == 1
    assert v.not_completed == ["a: 1 node(s) not completed (a-md-1)"]


def test_clusters_over_the_wave_limit_and_a_wave_started_early() -> None:
    t = topo(wave_of={"a": "default", "b": "default"})
    v = check(serial("a", 0) + serial("b", 2), {}, t)
    assert v.concurrency and v.max_clusters_at_once == {"default": 2}
    v = check(serial("a", 0) + serial("b", 3), {}, topo())  # b's wave before a's ended
    assert len(v.wave_order) == 1 and v.concurrency == []


def test_handoff_counts_from_the_kill_or_the_completion_after_it() -> None:
    runs = serial("a", 0)  # requests at 0, 1, 2, 3; completions at 1, 2, 3, 4
    # Killed at 1.5 with a-cp-1 in flight (completes at 2): a-md-0 asked at 2 waited 0.
    assert [(h.cluster, h.waited_s) for h in handoffs(runs, ["a"], 1.5)] == [("a", 0.0)]
    late = [*runs[:2], NodeRun("a", "a-md-0", "x", 12, 13)]
    assert [h.waited_s for h in handoffs(late, ["a"], 1.5)] == [10.0]
    # Not started before the kill, or done before it: no hand-off to measure.
    assert handoffs(runs, ["a"], -1) == [] and handoffs(runs, ["a"], 5) == []
