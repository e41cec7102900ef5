"""Before acting on a taken shard, a replica waits until its NodePlan cache holds what
the previous holder dispatched for the shard's clusters, and only that."""

from __future__ import annotations

from typing import Any

from fleet.controllers.runner import plans_not_cached
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
