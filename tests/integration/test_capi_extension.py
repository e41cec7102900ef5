"""The extension path to completion, driven by the real Cluster API manager.

At both pinned CAPI versions, with the ``RuntimeSDK`` and ``InPlaceUpdates`` gates on:
the manager discovers k0s-fleet's runtime extension through an ExtensionConfig (``url``
+ ``caBundle``), and when the MachineDeployment's version changes it asks
CanUpdateMachineSet, moves the Machines to the new MachineSet without recreating them
and calls UpdateMachine on each; the extension dispatches NodePlans that the k0s-fleet
controller carries through with real agents on simulated nodes (``SimNodeFarm``).

Nothing stands for Cluster API here. The providers are played through their contracts
(``ProviderPlayer``); the K0sControlPlane is a stand-in with no Machines.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.cli.upgrade import apply_upgrade
from fleet.config.models import FleetConfig
from fleet.controllers.runner import FleetController, Tuning
from fleet.controllers.trigger import Trigger
from fleet.events import EventRecorder, list_events
from fleet.extension import (
    ExtensionEndpoint,
    handlers_from_config,
    start_extension_server,
    workload_client_from_registry,
)
from fleet.extension.exclusion import ExtensionExclusion
from fleet.extension.selfsigned import make_cert_pair
from fleet.extension.wire import ResponseStatus, UpdateMachineRequest, UpdateMachineResponse
from fleet.kube import KubeClient, NotFoundError
from fleet.kube.resources import (
    EXTENSION_CONFIGS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
)
from fleet.kube.watch import Reflector, WatchEvent
from fleet.planner import conditions as C
from fleet.rollout.policy import RolloutPolicy
from fleet.testing.capi import TEST_CLUSTER_LABEL, create_capi_cluster, hand_edit
from fleet.testing.capimanager import IN_PLACE_GATES, CapiEnvs, capi_version, capi_versions
from fleet.testing.providers import ProviderPlayer
from fleet.testing.releases import ReleaseServer
from fleet.testing.simfarm import SimNodeFarm
from fleet.testing.world import World
from fleet.world.model import ANN_CAPI_PAUSED, ANN_WRITTEN_VERSION, LABEL_CLUSTER_NAME
from tests.helpers.capienv import capi_namespace, playing, provisioned, wait_for
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
UPDATE_IN_PROGRESS = "in-place-updates.internal.cluster.x-k8s.io/update-in-progress"
PENDING_HOOKS = "runtime.cluster.x-k8s.io/pending-hooks"


def fleet_config(namespace: str, tls: TlsFiles, download: str, digest: str, *,
                 waves: list[dict[str, Any]] | None = None,
                 entries: list[dict[str, Any]] | None = None) -> FleetConfig:
    deadline = "60s"
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "extension": {"enabled": True, "mode": "auto", "certFile": str(tls.cert),
                      "keyFile": str(tls.key)},
        "clusters": {"namespaces": [namespace], "entries": entries or []},
        "download": {"urlTemplate": download, "digests": {V2: {"amd64": digest}}},
        "agent": {"drainTimeout": "20s", "verifyTimeout": "20s"},
        "rollout": {"progressDeadlines": {k: deadline for k in (
            "pending", "downloading", "cordoning", "applyingUpdate", "restarting",
            "verifying", "unCordoning")}, "waves": waves or []},
    })


@dataclass
class Running:
    controller: FleetController
    exclusion: ExtensionExclusion
    holds: list[str]  # what the UpdateMachine hook's policy check answered CAPI ("" = go)
    refusals: list[str]  # the UpdateMachine hook's Failure answers to CAPI


@contextlib.asynccontextmanager
async def fleet_with_extension(mgmt: KubeClient, config: FleetConfig, ns: str, tls: TlsFiles,
                               clusters: list[str]) -> AsyncIterator[Running]:
    """The controller composed as ``k0s-fleet controller`` composes it (rollout policy
    wrapped by the extension exclusion), its runtime extension served on loopback and
    registered with the real CAPI manager by an ExtensionConfig (``url`` + ``caBundle``),
    once CAPI has discovered it for every one of ``clusters``."""
    trigger = Trigger()
    recorder = EventRecorder(mgmt, instance="k0s-fleet", default_namespace=ns)
    exclusion = ExtensionExclusion(mgmt, config, RolloutPolicy(mgmt, config, recorder=recorder),
                                   endpoint=ExtensionEndpoint(url=""), on_change=trigger.poke)
    controller = FleetController(mgmt, config, tuning=Tuning(watch_timeout=30), trigger=trigger,
                                 recorder=recorder, policy=exclusion)
    ec_name = unique("k0s-fleet")
    async with anyio.create_task_group() as tg:
        tg.start_soon(exclusion.run)
        await tg.start(controller.run)
        handlers = handlers_from_config(
            config, mgmt=mgmt, workload_client=workload_client_from_registry(controller.registry))
        assert handlers.update is not None and handlers.update.policy_hold is not None
        check = handlers.update.policy_hold
        holds: list[str] = []

        async def observed(machine: Mapping[str, Any], namespace: str, cluster: str
                           ) -> str | None:
            why = await check(machine, namespace, cluster)
            holds.append(why or "")
            return why

        handlers.update.policy_hold = observed
        refusals: list[str] = []
        service = handlers.update
        handle = service.handle

        async def answered(req: UpdateMachineRequest) -> UpdateMachineResponse:
            resp = await handle(req)
            if resp.status == ResponseStatus.FAILURE:
                refusals.append(resp.message)
            return resp

        service.handle = answered  # type: ignore[method-assign]
        server = await start_extension_server(handlers, cert_file=str(tls.cert),
                                              key_file=str(tls.key), host="127.0.0.1", port=0)
        try:
            exclusion.endpoint = ExtensionEndpoint(url=server.url)
            # Registered as a user would; CAPI's ExtensionConfig controller does the
            # discovery call itself and records our handlers.
            await mgmt.create(EXTENSION_CONFIGS, {
                "metadata": {"name": ec_name},
                "spec": {"clientConfig": {
                    "url": server.url,
                    "caBundle": base64.b64encode(tls.ca.read_bytes()).decode()},
                    "namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": ns}}}})
            for name in clusters:
                async def discovered(name: str = name) -> bool:
                    return exclusion.owns(ns, name)

                await wait_for("CAPI to discover the extension", discovered)
            yield Running(controller, exclusion, holds, refusals)
        finally:
            await server.close()
            with contextlib.suppress(NotFoundError):
                await mgmt.delete(EXTENSION_CONFIGS, ec_name)
            tg.cancel_scope.cancel()


@dataclass
class TlsFiles:
    cert: Path
    key: Path
    ca: Path


def closed_window(now: datetime) -> dict[str, str]:
    """A daily one-hour maintenance window twelve hours away: closed for the test."""
    return {"schedule": f"0 {(now.hour + 12) % 24} * * *", "duration": "1h",
            "timeZone": "UTC"}


async def linked_machines(mgmt: KubeClient, ns: str, count: int
                          ) -> list[dict[str, Any]] | None:
    ms = [m for m in (await mgmt.list(MACHINES, ns)).items
          if ((m.get("status") or {}).get("nodeRef") or {}).get("name")]
    return ms if len(ms) == count else None


def cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype), {})


@pytest.mark.parametrize("version", capi_versions())
async def test_real_capi_drives_in_place_upgrade_through_the_extension_in_waves(  # noqa: PLR0917
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, tmp_path: Path,
        short_tmp: Path, version: str) -> None:
    """A FleetUpgrade for the fleet; the first wave's cluster goes first: k0s-fleet writes
    its versions (control plane paused, then the MachineDeployment unpaused), the real CAPI
    manager calls the hooks and every node is upgraded in place by real agents. The
    second cluster waits for the first wave (its wave Pending meanwhile), then stays held
    by its closed maintenance window: its MachineDeployment's version is never written,
    CAPI never moves its Machines, no node of it starts.

    Both MachineDeployments reference a K0sWorkerConfigTemplate whose version is kept in
    step with theirs (as k0smotron's docs show): the first one's moves to the target
    exactly once, in a write carrying k0s-fleet's written-version annotation (by the
    controller, no one else); the held one's is adopted and stays."""
    env = await capi_envs.get(version, IN_PLACE_GATES)
    mgmt = env.client
    kubeconfig = crds_installed["wl1"].kubeconfig()
    cert, key, ca = make_cert_pair(["localhost"]).write(tmp_path / "tls")
    tls = TlsFiles(cert, key, ca)
    async with capi_namespace(env) as ns, ReleaseServer() as rs:
        old, new = rs.add(V1), rs.add(V2)
        first, second = unique("c"), unique("c")
        config = fleet_config(
            ns, tls, rs.base_url + "/k0s/{version}?arch={arch}", new.sha256,
            waves=[{"name": "first", "clusterSelector": {"matchLabels": {
                TEST_CLUSTER_LABEL: first}}}],
            entries=[{"name": second, "namespace": ns,
                      "maintenanceWindows": [closed_window(datetime.now(UTC))]}])
        farm = SimNodeFarm(kubeconfig, short_tmp, old)

        async def workload(_ns: str, _cluster: str) -> KubeClient:
            return wl1

        player = ProviderPlayer(mgmt, workload, node_factory=farm.node_factory, namespace=ns)
        wave_phases: set[str] = set()
        # every state of each worker template's version: (version, written-version annotation)
        template_history: dict[str, list[tuple[str | None, str | None]]] = {}

        async def template_changed(ev: WatchEvent) -> None:
            tpl = ev.object
            seen = (tpl["spec"]["template"]["spec"].get("version"),
                    (tpl["metadata"].get("annotations") or {}).get(ANN_WRITTEN_VERSION))
            history = template_history.setdefault(tpl["metadata"]["name"], [])
            if not history or history[-1] != seen:
                history.append(seen)

        templates = Reflector(mgmt, K0S_WORKER_CONFIG_TEMPLATES, namespace=ns,
                              listener=template_changed)
        async with anyio.create_task_group() as tg:
            await tg.start(farm.run)
            tg.start_soon(templates.run)
            async with playing(player):
                a = await create_capi_cluster(
                    mgmt, kubeconfig, namespace=ns, name=first, version=V1, workers=3,
                    max_unavailable=1, max_surge=0, control_plane_replicas=0,
                    worker_template_version=V1)
                b = await create_capi_cluster(
                    mgmt, kubeconfig, namespace=ns, name=second, version=V1, workers=1,
                    max_unavailable=1, max_surge=0, control_plane_replicas=0,
                    worker_template_version=V1)
                machines = await wait_for("4 Machines linked to Nodes",
                                          lambda: linked_machines(mgmt, ns, 4))
                before = {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines}
                of_a = {m["metadata"]["name"] for m in machines
                        if m["metadata"]["labels"][LABEL_CLUSTER_NAME] == first}
                sets_before = {s["metadata"]["name"]
                               for s in (await mgmt.list(MACHINE_SETS, ns)).items}

                async with fleet_with_extension(mgmt, config, ns, tls, [first, second]):
                    await apply_upgrade(mgmt, namespace=ns, name="to-v2", version=V2,
                                        selector=None)

                    async def upgraded() -> bool:
                        fu = await mgmt.get(FLEET_UPGRADES, "to-v2", ns)
                        wave_phases.update(w["phase"] for w in (fu.get("status") or {}).get(
                            "waves") or [] if w["name"] == "default")
                        ms = [m for m in (await mgmt.list(MACHINES, ns)).items
                              if m["metadata"]["name"] in of_a]
                        nodes = [farm.nodes.get(m["metadata"]["name"]) for m in ms]
                        running = [await n.running_version() if n else None
                                   for n in nodes]
                        return (len(ms) == 3
                                and all(m["spec"]["version"] == V2 for m in ms)
                                and not any(UPDATE_IN_PROGRESS in (
                                    m["metadata"].get("annotations") or {}) for m in ms)
                                and running == [V2] * 3)

                    await wait_for("the first wave's nodes upgraded in place", upgraded,
                                   timeout=300)

                    async def md_a_up_to_date() -> dict[str, Any] | None:
                        md = await mgmt.get(MACHINE_DEPLOYMENTS, a.md, ns)
                        c = cond(md, C.UP_TO_DATE)
                        return c if c.get("status") == "True" else None

                    # k0s-fleet's condition judges by what the nodes report.
                    up = await wait_for("K0sFleetUpToDate on the first cluster's MD",
                                        md_a_up_to_date)
                    assert up["message"].startswith(f"3/3 machines on {V2}"), up

                    seen: list[dict[str, Any]] = []

                    async def second_held() -> dict[str, Any] | None:
                        fu = await mgmt.get(FLEET_UPGRADES, "to-v2", ns)
                        st = fu.get("status") or {}
                        seen[:] = [st]
                        mine = [c for c in st.get("clusters") or [] if c["name"] == second]
                        return mine[0] if mine and "maintenance window" in mine[0][
                            "message"] else None

                    try:
                        held = await wait_for("the second cluster held by its window",
                                              second_held)
                    except AssertionError as e:
                        raise AssertionError(f"{e}; FleetUpgrade status: {seen}") from None
                    assert held["phase"] == "Queued", held
            tg.cancel_scope.cancel()

        machines = (await mgmt.list(MACHINES, ns)).items
        # Every Machine kept its name and UID: upgraded in place, none recreated.
        assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == before
        plans = (await mgmt.list(NODE_PLANS, ns)).items
        assert sorted(p["spec"]["machineName"] for p in plans) == sorted(of_a)
        assert {p["spec"]["source"] for p in plans} == {"runtime-extension"}
        assert {p["status"]["phase"] for p in plans} == {"Completed"}
        for n in farm.nodes.values():
            assert n.restarts == (1 if n.name in of_a else 0), (n.name, n.history)
        # The second wave waited for the first.
        assert "Pending" in wave_phases, wave_phases
        sets_after = {s["metadata"]["name"]: s for s in (await mgmt.list(MACHINE_SETS, ns)).items}
        new_sets = set(sets_after) - sets_before
        # CAPI moved the first cluster's Machines to one new MachineSet (CanUpdateMachineSet
        # said yes); the second cluster's never moved.
        assert len(new_sets) == 1, sets_after.keys()
        assert {m["metadata"]["labels"]["cluster.x-k8s.io/set-name"]
                for m in machines if m["metadata"]["name"] in of_a} == new_sets
        for m in machines:
            if m["metadata"]["name"] not in of_a:
                assert m["spec"]["version"] == V1
                assert m["metadata"]["labels"]["cluster.x-k8s.io/set-name"] in sets_before
        md_a = await mgmt.get(MACHINE_DEPLOYMENTS, a.md, ns)
        md_b = await mgmt.get(MACHINE_DEPLOYMENTS, b.md, ns)
        assert md_a["metadata"]["annotations"][ANN_WRITTEN_VERSION] == V2
        assert ANN_CAPI_PAUSED not in md_a["metadata"]["annotations"]  # CAPI drives: unpaused
        assert md_b["spec"]["template"]["spec"]["version"] == V1
        assert md_b["metadata"]["annotations"][ANN_WRITTEN_VERSION] == V1
        # Control planes first, through the paused executor (the stand-in KCP has no
        # Machines): written and released.
        kcp_a = await mgmt.get(K0S_CONTROL_PLANES, a.kcp, ns)
        assert kcp_a["spec"]["version"] == V2 and ANN_CAPI_PAUSED not in kcp_a["metadata"][
            "annotations"]
        assert (await mgmt.get(K0S_CONTROL_PLANES, b.kcp, ns))["spec"]["version"] == V1
        # The worker bootstrap templates: the first cluster's went V1 -> V2 once, the
        # version and k0s-fleet's annotation in one write (the controller's: no one else
        # sets that annotation); the held cluster's adopted at V1 and never moved.
        assert template_history.get(a.worker_template) == [
            (V1, None), (V1, V1), (V2, V2)], template_history
        assert template_history.get(b.worker_template) == [
            (V1, None), (V1, V1)], template_history
        tpl_a = await mgmt.get(K0S_WORKER_CONFIG_TEMPLATES, a.worker_template, ns)
        assert tpl_a["spec"]["template"]["spec"]["version"] == V2
        if version == capi_version():
            # OWNERSHIP fact 5: CAPI v1.14 compares the kubelet's v1.31.3+k0s with the
            # Machine's v1.31.3+k0s.0 and never calls these Machines UpToDate.
            for m in machines:
                if m["metadata"]["name"] in of_a:
                    assert cond(m, "UpToDate").get("status") != "True", m["status"]


@pytest.mark.parametrize("version", capi_versions())
async def test_a_hand_edited_version_is_reported_and_the_real_capi_is_held(  # noqa: PLR0917
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, tmp_path: Path,
        short_tmp: Path, version: str) -> None:
    """No FleetUpgrade: the controller adopts the MachineDeployment at what it says. A
    user then writes a version into it by hand; the real CAPI manager reacts (in place:
    CanUpdateMachineSet, then UpdateMachine), but the hook answers "not yet" because
    k0s-fleet did not write that version (not the fleet's target: refused, the FleetTarget
    check), the MD carries K0sFleetVersionWriter=False with a Warning Event, and no node
    starts."""
    env = await capi_envs.get(version, IN_PLACE_GATES)
    mgmt = env.client
    kubeconfig = crds_installed["wl1"].kubeconfig()
    cert, key, ca = make_cert_pair(["localhost"]).write(tmp_path / "tls")
    tls = TlsFiles(cert, key, ca)
    async with capi_namespace(env) as ns, ReleaseServer() as rs:
        old, new = rs.add(V1), rs.add(V2)
        config = fleet_config(ns, tls, rs.base_url + "/k0s/{version}?arch={arch}",
                              new.sha256)
        name = unique("c")
        async with provisioned(mgmt, ns, wl=wl1, kubeconfig=kubeconfig, root=short_tmp,
                               initial=old) as farm:
            cluster = await create_capi_cluster(
                mgmt, kubeconfig, namespace=ns, name=name, version=V1, workers=2,
                max_unavailable=1, max_surge=0, control_plane_replicas=0)
            machines = await wait_for("2 Machines linked to Nodes",
                                      lambda: linked_machines(mgmt, ns, 2))
            before = {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines}
            async with fleet_with_extension(mgmt, config, ns, tls, [name]) as run:
                async def adopted() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                    anns = md["metadata"].get("annotations") or {}
                    return anns.get(ANN_WRITTEN_VERSION) == V1

                await wait_for("the MachineDeployment adopted", adopted)
                await hand_edit(mgmt, cluster, V2, control_plane=False)

                async def reported() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                    c = cond(md, C.VERSION_WRITER)
                    return (c.get("status") == "False"
                            and c.get("reason") == C.R_CHANGED_BY_OTHER)

                await wait_for("K0sFleetVersionWriter=False", reported)

                async def capi_held() -> bool:
                    return any(f"FleetTarget: the fleet's target for MachineDeployment "
                               f"{cluster.md} is {V1}, not {V2}" in r for r in run.refusals)

                # CAPI moved on to UpdateMachine; the hook refused to start the node.
                await wait_for("CAPI's UpdateMachine held", capi_held, timeout=180)

                async def event() -> bool:
                    evs = await list_events(mgmt, ns)
                    return any(e.get("reason") == "VersionChangedByOther"
                               and (e.get("regarding") or {}).get("name") == cluster.md
                               for e in evs)

                await wait_for("the Warning Event", event)
                assert all(h != "" for h in run.holds), run.holds
                for n in farm.nodes.values():
                    assert await n.running_version() == V1, (n.name, n.history)

        assert (await mgmt.list(NODE_PLANS, ns)).items == []  # no node started
        for n in farm.nodes.values():
            assert n.restarts == 0, (n.name, n.history)
        machines = (await mgmt.list(MACHINES, ns)).items
        assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == before
        md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
        assert md["metadata"]["annotations"][ANN_WRITTEN_VERSION] == V1
