"""`k0s-fleet plan --version` / `upgrade --dry-run` judge a control plane's in-place
upgrade as the controller does (#31, first hour): the infrastructure Machines read are
those of the control planes the previewed FleetUpgrade puts out of date, through the
controller's own reader (fleet/controllers/infra.py), so a control plane k0smotron would
let go in place is shown in place, not "Cluster API replaces it: infrastructure machine
unreadable" (the preview used to be laid over an observation made without it, so no
infrastructure Machine had been read at all)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleet.cli.plan import parse_preview, plan_with
from fleet.controllers.infra import InfraMachines
from fleet.kube import KubeClient
from fleet.kube.resources import SERVICE_ACCOUNTS
from fleet.testing.capi import INFRA_MACHINES, create_cluster, ensure_infra_crd
from fleet.testing.world import World
from fleet.world.model import TemplateRef
from tests.helpers.controller import fleet_config
from tests.helpers.names import unique
from tests.helpers.rbac import service_account_token

TARGET = "v1.31.3+k0s.0"


@pytest.mark.anyio
async def test_preview_reads_the_infrastructure_machines_the_controller_would(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    fc = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(), namespace=namespace,
                              name="edge", control_planes=1, workers=1,
                              node_prefix=unique("edge"))
    config = fleet_config(namespace)
    doc, obs = await plan_with(mgmt, config, now=datetime.now(UTC),
                               preview=parse_preview(TARGET))
    assert doc["preview"]["clusters"] == [f"{namespace}/edge"]
    (cp,) = [o for w in doc["waves"] for c in w["clusters"] for o in c["objects"]
             if o["kind"] == "K0sControlPlane"]
    assert cp["clusterAPI"] == [], cp["clusterAPI"]
    assert cp["cannotTell"] == []
    assert cp["inPlace"] == fc.control_planes
    assert cp["nodeOrder"] == fc.control_planes
    infra = obs.snapshot.machines[(namespace, fc.control_planes[0])].infra
    assert infra is not None and infra.error is None and infra.cloned_from_name
    assert doc["blocked"] == [] and doc["estimatedDuration"] is not None


@pytest.mark.anyio
async def test_an_infrastructure_machine_the_reader_may_not_read_is_marked_denied(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    """Read with an identity without the controller's grant (no RBAC at all here): the
    read is refused, and marked so, for the plan to say it cannot tell rather than that
    Cluster API replaces the Machine (tests/unit/test_rollout_plan.py shows the text)."""
    await ensure_infra_crd(mgmt)
    fc = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(), namespace=namespace,
                              name="edge", control_planes=1, workers=0,
                              node_prefix=unique("edge"))
    ref = TemplateRef(INFRA_MACHINES.group, INFRA_MACHINES.kind, fc.control_planes[0])
    assert (await InfraMachines(mgmt).lookup(ref, namespace)).error is None
    await mgmt.create(SERVICE_ACCOUNTS, {"metadata": {"name": "viewer"}}, namespace)
    token = await service_account_token(mgmt, namespace, "viewer")
    async with await world["mgmt"].client(token=token) as viewer:
        info = await InfraMachines(viewer).lookup(ref, namespace)
    assert info.denied and info.error and "forbidden" in info.error.lower(), info
