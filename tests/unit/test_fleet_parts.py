"""FleetParts: a FleetUpgrade's status write rebuilds no part; a change of what the
planner reads of it (version, selector, deletion) rebuilds every part."""

from __future__ import annotations

import copy
from typing import Any

from fleet.config import FleetConfig
from fleet.controllers.parts import FleetParts
from fleet.kube.cache import ObjectCache
from fleet.kube.resources import FLEET_UPGRADES


def upgrade(rv: int, version: str = "v1.31.3+k0s.0", **status: Any) -> dict[str, Any]:
    return {"apiVersion": FLEET_UPGRADES.api_version, "kind": "FleetUpgrade",
            "metadata": {"name": "to-v1.31.3", "namespace": "fleet", "resourceVersion": str(rv),
                         "generation": 1, "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": {"version": version}, "status": status}


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


def test_a_new_version_or_a_deletion_rebuilds_every_part() -> None:
    cache = ObjectCache("FleetUpgrade")
    parts = parts_with(cache)
    cache.observe(upgrade(1))
    settle(parts)
    cache.observe(upgrade(2, version="v1.31.4+k0s.0"))
    parts.refresh_upgrades()
    assert parts.everything
    settle(parts)
    deleting = copy.deepcopy(upgrade(3, version="v1.31.4+k0s.0"))
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T11:00:00Z"
    cache.observe(deleting)
    parts.refresh_upgrades()
    assert parts.everything
    settle(parts)
    cache.forget(deleting)
    parts.refresh_upgrades()
    assert parts.everything and parts.upgrades == {}
