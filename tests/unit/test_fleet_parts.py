"""FleetParts: a FleetUpgrade's status write rebuilds no part; a change of what the
planner reads of it (version, selector, deletion) rebuilds the parts of the clusters
whose intent it moves, not every part."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from fleet.config.models import FleetConfig
from fleet.controllers.parts import FleetParts
from fleet.kube.cache import ObjectCache
from fleet.kube.resources import FLEET_UPGRADES
from fleet.world.intent import fleet_upgrade_from, resolve
from fleet.world.model import ClusterInfo, ClusterKey, Snapshot
from fleet.world.snapshot import readable_objects

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def upgrade(rv: int, version: str = "v1.31.3+k0s.0", *, name: str = "to-v1.31.3",
            selector: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {"apiVersion": FLEET_UPGRADES.api_version, "kind": "FleetUpgrade",
            "metadata": {"name": name, "namespace": "fleet", "resourceVersion": str(rv),
                         "generation": 1, "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": {"version": version, **({"clusterSelector": selector} if selector else {})},
            "status": status}


def parts_with(cache: ObjectCache) -> FleetParts:
    parts = FleetParts(FleetConfig())
    parts.caches = {FLEET_UPGRADES: cache}
    cache.on_object = parts.listener(FLEET_UPGRADES)
    return parts


def settle(parts: FleetParts) -> None:
    parts.refresh_upgrades()
    parts.everything = parts.membership_changed = False


def test_a_status_write_rebuilds_no_part_but_is_seen() -> None:
    cache = ObjectCache("FleetUpgrade")
    parts = parts_with(cache)
    cache.observe(upgrade(1))
    settle(parts)
    cache.observe(upgrade(2, phase="Progressing", clustersUpgraded=3))
    parts.refresh_upgrades()
    assert not parts.everything
    (u,) = parts.upgrades.values()
    assert u.status == {"phase": "Progressing", "clustersUpgraded": 3}


def fleet_of(parts: FleetParts, *names: str) -> list[ClusterKey]:
    """Member clusters (label ring=<name>) and their parts as built now: each part with
    the intent the FleetUpgrades give its cluster."""
    parts.members = {("fleet", n): ClusterInfo("fleet", n, labels={"ring": n}) for n in names}
    intents = resolve(readable_objects(parts.caches[FLEET_UPGRADES], fleet_upgrade_from),
                      parts.members)
    parts.parts = {k: Snapshot(now=T0, intents={k: intents[k]} if k in intents else {})
                   for k in parts.members}
    return sorted(parts.members)


def test_a_new_version_or_a_deletion_rebuilds_the_parts_it_moves() -> None:
    cache = ObjectCache("FleetUpgrade")
    parts = parts_with(cache)
    cache.observe(upgrade(1))
    settle(parts)
    keys = fleet_of(parts, "a", "b")
    cache.observe(upgrade(2, version="v1.31.4+k0s.0"))
    parts.refresh_upgrades()
    assert not parts.everything and parts.dirty == set(keys)
    settle(parts)
    parts.dirty.clear()
    fleet_of(parts, "a", "b")
    deleting = copy.deepcopy(upgrade(3, version="v1.31.4+k0s.0"))
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T11:00:00Z"
    cache.observe(deleting)
    parts.refresh_upgrades()
    assert parts.dirty == set(keys)
    settle(parts)
    parts.dirty.clear()
    fleet_of(parts, "a", "b")
    cache.forget(deleting)
    parts.refresh_upgrades()
    assert parts.upgrades == {}
    assert parts.dirty == set(), "no cluster's intent moved (it was being deleted)"


def test_a_new_fleet_upgrade_rebuilds_only_the_clusters_it_selects() -> None:
    """A FleetUpgrade for one cluster of three: that cluster's part is rebuilt, the
    others' are not (they were re-planned with the whole fleet before: ~1 s per new
    FleetUpgrade at 1000 clusters)."""
    cache = ObjectCache("FleetUpgrade")
    parts = parts_with(cache)
    settle(parts)
    _, b, _ = fleet_of(parts, "a", "b", "c")
    cache.observe(upgrade(1, name="b-only", selector={"matchLabels": {"ring": "b"}}))
    parts.refresh_upgrades()
    assert not parts.everything
    assert parts.dirty == {b}
    parts.dirty.clear()
    fleet_of(parts, "a", "b", "c")
    cache.observe(upgrade(2, version="v1.31.4+k0s.0", name="b-only",
                          selector={"matchLabels": {"ring": "b"}}))
    parts.refresh_upgrades()
    assert parts.dirty == {b}
    parts.dirty.clear()
    cache.observe(upgrade(2, version="v1.31.4+k0s.0", name="b-only",
                          selector={"matchLabels": {"ring": "b"}}, phase="Progressing"))
    parts.refresh_upgrades()
    assert parts.dirty == set(), "a status write moves no intent"
