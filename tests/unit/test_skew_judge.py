"""The tests' independent skew judge (tests.helpers.skew) catches each rule it is there
for: a judge that cannot fail would prove nothing about the ladder tests."""

from __future__ import annotations

from typing import Any

from tests.helpers.skew import FleetSkewWatcher


def _machine(name: str, version: str, *, cp: bool = False, cluster: str = "a"
             ) -> dict[str, Any]:
    labels = {"cluster.x-k8s.io/control-plane": ""} if cp else {}
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"clusterName": cluster, "version": version}}


def test_a_correct_climb_breaks_no_rule() -> None:
    w = FleetSkewWatcher(["a"])
    for v in ("v1.30.9+k0s.0", "v1.31.5+k0s.0", "v1.32.1+k0s.0"):
        w.observe(_machine("cp", v, cp=True))
        w.observe(_machine("w", v))
    assert w.violations == []


def test_a_worker_ahead_of_its_control_plane_is_caught() -> None:
    w = FleetSkewWatcher(["a"])
    w.observe(_machine("cp", "v1.30.9+k0s.0", cp=True))
    w.observe(_machine("w", "v1.31.5+k0s.0"))
    assert any("worker skew" in v for v in w.violations)


def test_a_skip_and_a_downgrade_are_caught() -> None:
    w = FleetSkewWatcher(["a"])
    w.observe(_machine("w", "v1.30.9+k0s.0"))
    w.observe(_machine("w", "v1.32.1+k0s.0"))
    w.observe(_machine("w", "v1.31.1+k0s.0"))
    assert w.violations == ["w: v1.30.9+k0s.0 -> v1.32.1+k0s.0",
                            "w: v1.32.1+k0s.0 -> v1.31.1+k0s.0"]


def test_the_declared_and_hosted_control_planes_count() -> None:
    w = FleetSkewWatcher(["a", "b"])
    w.observe_declared({"metadata": {"name": "kcp", "labels": {
        "cluster.x-k8s.io/cluster-name": "a"}}, "spec": {"version": "v1.30.9+k0s.0"}})
    w.observe(_machine("w", "v1.31.5+k0s.0"))
    assert any("worker skew" in v for v in w.violations)
    w.observe_hosted({"metadata": {"name": "hcp", "labels": {
        "cluster.x-k8s.io/cluster-name": "b"}}, "status": {"version": "v1.30.9+k0s.0"}})
    w.observe(_machine("wb", "v1.28.0+k0s.0", cluster="b"))
    assert any("worker skew" in v and "wb" in v for v in w.violations)
