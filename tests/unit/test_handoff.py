"""Taking over a shard (fleet/controllers/handoff.py): before acting on it, a replica
waits until its NodePlan cache holds what the previous holder dispatched for the shard's
clusters, and only that; a bulk re-read of its objects goes on where a cut-off look
stopped."""

from __future__ import annotations

from typing import Any

from fleet.controllers.handoff import BulkReread, plans_not_cached
from fleet.model import ClusterKey


def plan(ns: str, name: str, cluster: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterName": cluster}}


LISTED = [plan("fleet", "a-cp-0-v2", "a"), plan("fleet", "b-md-3-v2", "b"),
          plan("other", "a-md-0-v2", "a")]


def test_a_plan_another_replica_just_created_does_not_hold_a_taken_shard() -> None:
    """b is not taken: its newest NodePlan (not yet delivered by the watch) is no reason
    to wait; a's are all cached."""
    cached = {("fleet", "a-cp-0-v2"), ("other", "a-md-0-v2")}

    def taken(key: ClusterKey) -> bool:
        return key == ("fleet", "a")

    assert plans_not_cached(LISTED, lambda n, ns: (ns, n) in cached, taken) == []
    # without the taken clusters named, every listed plan counts (the old check)
    assert plans_not_cached(LISTED, lambda n, ns: (ns, n) in cached) == ["fleet/b-md-3-v2"]


def test_a_taken_clusters_plan_not_yet_cached_holds_the_shard() -> None:
    cached = {("fleet", "b-md-3-v2")}

    def taken(key: ClusterKey) -> bool:
        return key[1] == "a"

    assert plans_not_cached(LISTED, lambda n, ns: (ns, n) in cached, taken) == [
        "fleet/a-cp-0-v2", "other/a-md-0-v2"]
    # a cluster of the same name in another namespace is another cluster
    assert plans_not_cached(LISTED, lambda n, ns: (ns, n) in cached,
                            lambda key: key == ("other", "a")) == ["other/a-md-0-v2"]


A, B, C = ("fleet", "a"), ("fleet", "b"), ("fleet", "c")
MACHINES_AT = ("fleet", "machines")


def test_a_bulk_reread_goes_on_for_the_same_clusters_or_fewer() -> None:
    bulk = BulkReread()
    bulk.start(frozenset({A, B}))
    assert bulk.resume_from(MACHINES_AT) is None and not bulk.finished(MACHINES_AT)
    bulk.read(MACHINES_AT, "page-2")
    bulk.start(frozenset({A}))  # one given back since: the pages read still count
    assert bulk.resume_from(MACHINES_AT) == "page-2"
    bulk.read(MACHINES_AT, None)
    assert bulk.finished(MACHINES_AT)


def test_a_bulk_reread_for_more_clusters_starts_over() -> None:
    bulk = BulkReread()
    bulk.start(frozenset({A}))
    bulk.read(MACHINES_AT, None)
    bulk.start(frozenset({A, C}))  # C's objects were not kept in full when it was read
    assert not bulk.finished(MACHINES_AT) and bulk.resume_from(MACHINES_AT) is None


def test_a_list_whose_snapshot_is_gone_restarts_alone() -> None:
    bulk = BulkReread()
    bulk.start(frozenset({A}))
    bulk.read(MACHINES_AT, "page-3")
    bulk.read(("fleet", "secrets"), None)
    bulk.restart(MACHINES_AT)
    assert bulk.resume_from(MACHINES_AT) is None and bulk.finished(("fleet", "secrets"))
    bulk.reset()
    assert bulk.clusters == frozenset() and not bulk.finished(("fleet", "secrets"))
