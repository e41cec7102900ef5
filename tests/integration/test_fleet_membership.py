"""Fleet membership on real servers (issue #12 item 6): a cluster listed in
clusters.entries outside clusters.namespaces is watched and rolled like any other, and its
custom kubeconfigSecret is read even without Cluster API's Secret type."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import anyio
import pytest
import yaml

from fleet.config.models import FleetConfig
from fleet.kube import KubeClient
from fleet.kube.resources import SECRETS
from fleet.testing.capi import create_cluster, ensure_infra_crd
from fleet.testing.world import World
from tests.helpers.controller import V1, fleet_config_dict, running_controller, wait_rollout
from tests.helpers.names import fresh_namespace, unique

pytestmark = pytest.mark.anyio


@pytest.fixture
async def other_namespace(mgmt: KubeClient) -> AsyncIterator[str]:
    async with fresh_namespace(mgmt) as name:
        yield name


async def test_entry_outside_namespaces_with_an_opaque_kubeconfig_secret_is_controlled(
        mgmt: KubeClient, wl2: KubeClient, crds_installed: World, namespace: str,
        other_namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    name = unique("entry")
    fc = await create_cluster(mgmt, wl2, crds_installed["wl2"].kubeconfig(),
                              namespace=other_namespace, name=name, control_planes=0,
                              workers=2, max_unavailable=1)
    # The CAPI-typed Secret goes; a plain (Opaque) one under a custom name stands in.
    await mgmt.delete(SECRETS, f"{name}-kubeconfig", other_namespace)
    await mgmt.create(SECRETS, {
        "metadata": {"name": f"{name}-proxied", "namespace": other_namespace},
        "type": "Opaque",
        "data": {"value": base64.b64encode(yaml.safe_dump(
            crds_installed["wl2"].kubeconfig()).encode()).decode()}}, other_namespace)
    raw = fleet_config_dict(namespace)
    raw["clusters"]["entries"] = [{"name": name, "namespace": other_namespace,
                                   "kubeconfigSecret": f"{name}-proxied"}]
    config = FleetConfig.model_validate(raw)
    async with running_controller(mgmt, config) as controller:
        # Nothing to do at V1, and the cluster's Nodes are seen through the custom Secret
        # (its watch may list them a moment after the MD's condition is written).
        await wait_rollout(mgmt, fc, timeout=60, target=V1)
        with anyio.fail_after(60):
            while not ((wc := controller.registry.get((other_namespace, name))) is not None
                       and wc.observed):
                await anyio.sleep(0.05)
        assert wc.error is None
