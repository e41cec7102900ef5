"""Control planes' infrastructure Machines are read once per Machine, not every 10 s.

Issue #13 target 2: a rolling cluster's planning passes (one per watch event, the
controller's own status writes included) re-read its three out-of-date control planes'
infrastructure Machines whenever the 10 s cache had expired (11 908 GETs in a 10 x 300
roll), each pass waiting for the round trip before it dispatched. The ``cloned-from``
annotations are written when the infrastructure Machine is cloned; what a read found is
kept while the Machine is the same one (its uid), a replaced Machine of the same name is
read again, and a read that found nothing is tried again after 10 s as before.
"""

from __future__ import annotations

import pytest

from fleet.controllers.infra import InfraMachines
from fleet.kube import KubeClient
from fleet.testing.capi import INFRA_MACHINES, ensure_infra_crd
from fleet.testing.providers import INFRA_GROUP
from fleet.world.model import (
    ANN_CLONED_FROM_GROUPKIND,
    ANN_CLONED_FROM_NAME,
    TemplateRef,
)
from tests.helpers.clock import FakeClock


async def create_infra_machine(mgmt: KubeClient, name: str, namespace: str) -> None:
    """An infrastructure Machine cloned from the template ``cp-template``."""
    await mgmt.create(INFRA_MACHINES, {
        "apiVersion": INFRA_MACHINES.api_version, "kind": INFRA_MACHINES.kind,
        "metadata": {"name": name, "namespace": namespace, "annotations": {
            ANN_CLONED_FROM_NAME: "cp-template",
            ANN_CLONED_FROM_GROUPKIND: f"SimMachineTemplate.{INFRA_GROUP}"}},
        "spec": {}}, namespace)


@pytest.mark.anyio
async def test_a_found_infrastructure_machine_is_not_read_again_for_the_same_machine(
        mgmt: KubeClient, namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    await create_infra_machine(mgmt, "cp-0", namespace)
    clock = FakeClock(1000.0)
    infra = InfraMachines(mgmt, clock=clock)
    ref = TemplateRef(INFRA_GROUP, INFRA_MACHINES.kind, "cp-0")

    first = await infra.lookup(ref, namespace, machine_uid="uid-1")
    assert first.cloned_from_name == "cp-template" and first.error is None
    assert infra.reads == 1
    clock.now += 11  # past the 10 s the old cache kept every answer
    assert await infra.lookup(ref, namespace, machine_uid="uid-1") == first
    clock.now += 200
    assert await infra.lookup(ref, namespace, machine_uid="uid-1") == first
    assert infra.reads == 1, "read again although the Machine is the same one"

    # A Machine replaced under the same name (k0smotron names control planes by index):
    # its own infrastructure Machine is read.
    assert await infra.lookup(ref, namespace, machine_uid="uid-2") == first
    assert infra.reads == 2
    # Long after, even the same Machine's is read again (a hand edit is seen in time).
    clock.now += 301
    await infra.lookup(ref, namespace, machine_uid="uid-2")
    assert infra.reads == 3


@pytest.mark.anyio
async def test_an_infrastructure_machine_not_found_is_looked_up_again_after_ttl(
        mgmt: KubeClient, namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    clock = FakeClock(1000.0)
    infra = InfraMachines(mgmt, clock=clock)
    ref = TemplateRef(INFRA_GROUP, INFRA_MACHINES.kind, "cp-later")
    missing = await infra.lookup(ref, namespace, machine_uid="uid-1")
    assert missing.error is not None and infra.reads == 1
    clock.now += 5
    assert await infra.lookup(ref, namespace, machine_uid="uid-1") == missing
    assert infra.reads == 1
    await create_infra_machine(mgmt, "cp-later", namespace)
    clock.now += 6
    found = await infra.lookup(ref, namespace, machine_uid="uid-1")
    assert found.cloned_from_name == "cp-template" and infra.reads == 2
