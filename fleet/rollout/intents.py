"""FleetUpgrade status from the rollout gate's decision (pure) and its writer (thin I/O).

Each pass of the controller evaluates the gate; where a FleetUpgrade's status would say
something new (per wave, per cluster, its conditions), it is written to the status
subresource. Conditions keep their lastTransitionTime while their status stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from fleet.intent import ClusterStanding, WaveStanding, status_changed, upgrade_status
from fleet.kube import KubeClient, KubeError, patch_with_retry
from fleet.kube.resources import FLEET_UPGRADES
from fleet.model import ClusterKey, FleetUpgradeInfo, IntentTarget, format_time
from fleet.rollout.gate import ClusterPhase, GateDecision
from fleet.rollout.progress import ClusterProgress

log = logging.getLogger(__name__)


def standings(decision: GateDecision, clusters: Sequence[ClusterProgress]
              ) -> tuple[list[ClusterStanding], list[WaveStanding]]:
    out: list[ClusterStanding] = []
    for c in clusters:
        gate = decision.clusters.get(c.key)
        if gate is None:
            continue
        complete = gate.phase is ClusterPhase.COMPLETE
        message = "up to date" if complete else (gate.reason or "upgrading")
        out.append(ClusterStanding(
            key=c.key, wave=gate.wave, phase=gate.phase.value, nodes_done=c.nodes_done,
            nodes_total=c.nodes_total, message=message, complete=complete,
            failed=gate.phase is ClusterPhase.FAILED))
    waves = [WaveStanding(w.name, w.phase.value, w.message) for w in decision.waves]
    return out, waves


def fleet_hold(decision: GateDecision) -> str | None:
    if decision.emergency_stop is not None:
        return f"emergency stop ({decision.emergency_stop})"
    if decision.halted is not None:
        return f"rollout halted: {decision.halted}"
    if decision.paused is not None:
        return f"rollout paused ({decision.paused})"
    return None


def _with_times(new: Mapping[str, Any], old: Mapping[str, Any], now: datetime
                ) -> dict[str, Any]:
    before = {c.get("type"): c for c in old.get("conditions") or [] if isinstance(c, dict)}
    conds = []
    for c in new.get("conditions") or []:
        prev = before.get(c["type"])
        ltt = prev.get("lastTransitionTime") if prev and prev.get("status") == c["status"] \
            else None
        conds.append({**c, "lastTransitionTime": ltt or format_time(now)})
    return {**new, "conditions": conds}


async def write_upgrade_status(client: KubeClient, upgrades: Mapping[Any, FleetUpgradeInfo],
                               intents: Mapping[ClusterKey, IntentTarget],
                               decision: GateDecision, clusters: Sequence[ClusterProgress],
                               *, clock: Callable[[], datetime]) -> int:
    """Write every FleetUpgrade's status that changed; returns how many were written."""
    if not upgrades:
        return 0
    stand, waves = standings(decision, clusters)
    hold = fleet_hold(decision)
    written = 0
    for u in sorted(upgrades.values(), key=lambda u: u.ref):
        if u.deleting:
            continue
        new = upgrade_status(u, intents, stand, waves, fleet_hold=hold)
        if not status_changed(u.status, new):
            continue
        body = _with_times(new, u.status, clock())

        def mutate(obj: dict[str, Any], body: dict[str, Any] = body) -> dict[str, Any] | None:
            current = obj.get("status") or {}
            if not status_changed(current, body):
                return None
            return {"status": _with_times(body, current, clock())}

        try:
            await patch_with_retry(client, FLEET_UPGRADES, u.ref.name, mutate, u.ref.namespace,
                                   subresource="status")
            written += 1
        except KubeError as e:
            log.warning("could not write the status of FleetUpgrade %s/%s: %s",
                        u.ref.namespace, u.ref.name, e)
    return written
