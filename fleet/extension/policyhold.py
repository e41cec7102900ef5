"""The fleet rollout policy for the UpdateMachine hook (thin I/O over fleet.rollout.hookgate).

Reads what the hook needs to decide whether a node may start now: the rollout ConfigMap
(operator switches and the controller's durable record of admitted clusters), the CAPI
Cluster (labels, pause annotation, ``spec.paused``) and the Machine's MachineDeployment
(its pause annotation). Without the ConfigMap (no controller with the rollout policy has
run yet) the wave admission is not checked; every other hold still is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from fleet.config.models import FleetConfig
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    K0S_WORKER_CONFIG_TEMPLATES,
    MACHINE_DEPLOYMENTS,
)
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.gate import FleetControls
from fleet.rollout.hookgate import HookSubject, hook_hold
from fleet.rollout.state import RolloutState
from fleet.world.model import deployment_from
from fleet.world.snapshot import template_key

# (Machine as stored, namespace, cluster name) -> why not now, or None
PolicyHold = Callable[[Mapping[str, Any], str, str], Awaitable["str | None"]]

LABEL_DEPLOYMENT_NAME = "cluster.x-k8s.io/deployment-name"


def policy_hold_from_config(config: FleetConfig, mgmt: KubeClient, *,
                            clock: Callable[[], datetime] = lambda: datetime.now(UTC)
                            ) -> PolicyHold:
    async def hold(machine: Mapping[str, Any], namespace: str, cluster: str) -> str | None:
        cm = await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, config.management.namespace)
        key = f"{namespace}/{cluster}"
        if cm is None:
            controls, state = FleetControls(), RolloutState(admitted={key: ""})
        else:
            controls = FleetControls.from_annotations(
                (cm.get("metadata") or {}).get("annotations") or {})
            state = RolloutState.from_json((cm.get("data") or {}).get(STATE_KEY))
            if state.problem is not None:
                return f"the rollout record is unreadable, nothing new starts: {state.problem}"
        obj = await mgmt.get_or_none(CLUSTERS, cluster, namespace) or {}
        meta = obj.get("metadata") or {}
        labels = (machine.get("metadata") or {}).get("labels") or {}
        md_name = labels.get(LABEL_DEPLOYMENT_NAME)
        md = await mgmt.get_or_none(MACHINE_DEPLOYMENTS, md_name, namespace) if md_name else None
        # its K0sWorkerConfigTemplate (None where there is none, or its CRD is not served)
        tkey = template_key(deployment_from(md)) if md else None
        tpl = await mgmt.get_or_none(K0S_WORKER_CONFIG_TEMPLATES, tkey[1], tkey[0]) \
            if tkey else None
        tversion = ((((tpl or {}).get("spec") or {}).get("template") or {}).get("spec")
                    or {}).get("version")
        subject = HookSubject(
            namespace=namespace, cluster=cluster,
            cluster_labels=meta.get("labels") or {},
            cluster_annotations=meta.get("annotations") or {},
            cluster_spec_paused=bool((obj.get("spec") or {}).get("paused")),
            owner_kind="MachineDeployment" if md_name else "",
            owner_name=md_name or "",
            owner_annotations=((md or {}).get("metadata") or {}).get("annotations") or {},
            owner_version=(((md or {}).get("spec") or {}).get("template") or {}).get(
                "spec", {}).get("version"),
            template_name=tkey[1] if tkey else "",
            template_version=str(tversion) if tversion else None,
            template_annotations=((tpl or {}).get("metadata") or {}).get("annotations") or {})
        return hook_hold(config, controls, state, subject, clock())

    return hold


__all__ = ["PolicyHold", "policy_hold_from_config"]
