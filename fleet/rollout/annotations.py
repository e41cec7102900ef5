"""Operator switches for the fleet rollout, and where the rollout keeps its durable state.

All documented in docs/rollout-policy.md. Values of the pause / stop annotations are free
text: the reason, shown in status and Events ("" reads as "no reason given").
"""

from __future__ import annotations

from collections.abc import Mapping

from fleet.contract.signal import DOMAIN

# On the rollout ConfigMap (fleet level), the CAPI Cluster (cluster level), or a
# MachineDeployment / K0sControlPlane (object level): start no new node upgrades there.
ANN_PAUSED = f"{DOMAIN}/paused"
# On the rollout ConfigMap only: stop every new dispatch in the whole fleet at once.
ANN_EMERGENCY_STOP = f"{DOMAIN}/emergency-stop"

# The ConfigMap in management.namespace that holds the switches above (annotations) and
# the rollout's durable record (data[STATE_KEY]): wave start/completion times, pause and
# halt transitions. It is created by the controller when missing.
ROLLOUT_CONFIGMAP = "k0s-fleet-rollout"
STATE_KEY = "state.json"

_FALSE = {"false", "no", "0", "off"}


def switch(annotations: Mapping[str, str], key: str) -> str | None:
    """The reason given by an on/off annotation, or None when it is absent or says false.

    ``"true"`` (or any text but false/no/0/off) switches it on; the text is the reason.
    """
    value = annotations.get(key)
    if value is None or value.strip().lower() in _FALSE:
        return None
    value = value.strip()
    return "" if value.lower() in ("true", "yes", "1", "on") else value
