"""Fleets and configs for rollout-gate tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from fleet.config.models import FleetConfig
from fleet.rollout.gate import (
    FleetControls,
    FleetView,
    GateDecision,
    RolloutGate,
)
from fleet.rollout.progress import ClusterProgress, NodeProgress, NodeState, ObjectProgress
from fleet.rollout.state import RolloutState
from fleet.world.model import ObjectRef

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday


TARGET = "v1.31.3+k0s.0"


OLD = "v1.31.2+k0s.0"


def config(**rollout: Any) -> FleetConfig:
    # The simulated nodes download nothing: no digests needed (else the skew rules refuse
    # a FleetUpgrade's target before any write, fleet/contract/skew.py climb).
    return FleetConfig.model_validate({"rollout": rollout,
                                       "download": {"allowUnverified": True}},
                                      by_alias=True, by_name=False)


def cluster(name: str, states: str = "w", *, labels: Mapping[str, str] | None = None,
            namespace: str = "fleet", annotations: Mapping[str, str] | None = None,
            started: bool | None = None, observed: bool = True, spec_paused: bool = False,
            object_annotation: str | None = None) -> ClusterProgress:
    """``states``: one letter per node: u(p to date) g (upgrading) f(ailed) w(aiting)
    c (left to Cluster API) n(ot ready) m(issing)."""
    letters = {"u": NodeState.UP_TO_DATE, "g": NodeState.UPGRADING, "f": NodeState.FAILED,
               "w": NodeState.WAITING, "c": NodeState.CLUSTER_API, "n": NodeState.NOT_READY,
               "m": NodeState.MISSING}
    nodes = tuple(
        NodeProgress(f"{name}-m{i}", f"{name}-m{i}", letters[s],
                     TARGET if s == "u" else OLD)
        for i, s in enumerate(states))
    if started is None:
        started = any(s in "gf" for s in states) or (
            "u" in states and any(s != "u" for s in states))
    obj = ObjectProgress(ref=ObjectRef("MachineDeployment", namespace, f"{name}-md"),
                         target=TARGET, replicas=len(states), nodes=nodes, started=started,
                         paused=object_annotation)
    return ClusterProgress(namespace=namespace, name=name, labels=dict(labels or {}),
                           annotations=dict(annotations or {}), objects=(obj,),
                           observed=observed, spec_paused=spec_paused)


def behind(c: ClusterProgress) -> ClusterProgress:
    """``c`` as a replica sees it before the FleetUpgrade that gave it its target reached
    that replica: its objects still aim at the version every node runs (OLD)."""
    objects = tuple(dataclasses.replace(o, target=OLD, started=False, nodes=tuple(
        dataclasses.replace(n, state=NodeState.UP_TO_DATE, version=OLD) for n in o.nodes))
        for o in c.objects)
    return dataclasses.replace(c, objects=objects)


CANARY = {"ring": "canary"}


PROD = {"ring": "prod"}


def waves_config(**extra: Any) -> FleetConfig:
    base: dict[str, Any] = {
        "maxConcurrentClusters": 2,
        "waves": [
            {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
             "maxConcurrentClusters": 1, "soakSeconds": "30m"},
            {"name": "prod", "clusterSelector": {"matchLabels": PROD},
             "maxConcurrentClusters": 2, "soakSeconds": "10m", "failureBudget": 1},
        ],
    }
    base.update(extra)
    return config(**base)


def evaluate(cfg: FleetConfig, clusters: list[ClusterProgress], now: datetime = T0, *,
             state: RolloutState | None = None,
             controls: FleetControls | None = None) -> GateDecision:
    return RolloutGate(cfg).evaluate(
        FleetView(clusters, controls or FleetControls(), state or RolloutState()), now)
