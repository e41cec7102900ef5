"""A NodePlan the controller dispatches is created started (#13 item 5): the request's
identity is in the object the create writes, and the real kube-apiserver, through the
chart's CRD, shows it Pending to every reader (create answer, GET, LIST, watch, and the
table `kubectl get nodeplans` prints) before any status write."""

from __future__ import annotations

import json
import ssl
import urllib.request
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from fleet.artifacts import Artifact
from fleet.contract.nodeplan import NodePlanPhase
from fleet.dispatch import created_started, nodeplan_to_dispatch
from fleet.kube.resources import NAMESPACES, NODE_PLANS
from fleet.testing.world import CHART_CRDS, World, crd_documents, install_crds
from fleet.world.model import nodeplan_from

V2 = "v1.31.3+k0s.0"
AT = datetime(2026, 12, 1, 16, 40, 1, 123456, tzinfo=UTC)


def _machine(namespace: str) -> dict[str, Any]:
    return {"metadata": {"name": "m-0", "namespace": namespace, "uid": "0000-1111"},
            "spec": {"clusterName": "c"}}


def _table(world: World, path: str) -> dict[str, Any]:
    """What `kubectl get` asks for: the server's Table of the printer columns."""
    server = world["mgmt"]
    kc = server.kubeconfig()
    token = kc["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cadata=server.ca_pem.decode())
    req = urllib.request.Request(server.url + path, headers={
        "Authorization": f"Bearer {token}",
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        return dict(json.loads(resp.read()))


@pytest.mark.anyio
async def test_created_started_nodeplan_reads_pending_everywhere() -> None:
    with World(["mgmt"]) as world:
        async with await world["mgmt"].client() as mgmt:
            await install_crds(mgmt, crd_documents(CHART_CRDS))  # k0s-fleet's own only
            ns = "created-started"
            await mgmt.create(NAMESPACES, {"metadata": {"name": ns}})
            body = created_started(nodeplan_to_dispatch(
                machine=_machine(ns), node_name="n-0", role="worker", version=V2,
                artifact=Artifact(url="https://example.invalid/k0s", sha256="a" * 64,
                                  allow_unverified=False),
                executor="agent", owner_kind="MachineDeployment", owner_name="md",
                traceparent=None, node_policy=None), at=AT, reason="within maxUnavailable")
            name = body["metadata"]["name"]
            listed = await mgmt.list(NODE_PLANS, ns)
            created = await mgmt.create(NODE_PLANS, body, ns)

            # the request's identity, read back as every reader parses it
            for obj in (created, await mgmt.get(NODE_PLANS, name, ns)):
                p = nodeplan_from(obj)
                assert (p.started_at, p.attempts) == (AT, 1), obj
                assert obj["status"] == {"phase": NodePlanPhase.PENDING}, obj  # CRD default
            [item] = (await mgmt.list(NODE_PLANS, ns)).items
            assert item["status"]["phase"] == NodePlanPhase.PENDING
            with anyio.fail_after(60):
                async for event in mgmt.watch_lines(
                        NODE_PLANS, ns, resource_version=listed.resource_version,
                        label_selector=None, field_selector=None, timeout_seconds=30,
                        read_timeout=60):
                    if event.get("type") == "ADDED":
                        assert event["object"]["status"]["phase"] == NodePlanPhase.PENDING
                        break

            table = await anyio.to_thread.run_sync(
                _table, world, f"{NODE_PLANS.path(ns)}/{name}")
            columns = [c["name"] for c in table["columnDefinitions"]]
            [row] = table["rows"]
            assert row["cells"][columns.index("Phase")] == NodePlanPhase.PENDING, table

            # the first status write replaces the default (nothing else sets the phase)
            patched = await mgmt.patch(NODE_PLANS, name, {"status": {
                "phase": NodePlanPhase.IN_PROGRESS, "nodeState": "Downloading"}}, ns,
                subresource="status")
            assert patched["status"]["phase"] == NodePlanPhase.IN_PROGRESS
            assert nodeplan_from(patched).started_at == AT
