"""The controller's own worker executors against the real Cluster API manager (default
feature gates: no CAPI in-place updates), at both pinned versions.

* Paused in place: a FleetUpgrade; the controller writes the MachineDeployment's version
  together with its pause, upgrades every node through NodePlans (real agents on
  simulated nodes), pauses the MachineSet, moves its template's and the Machines'
  versions, and releases both pauses. CAPI creates no MachineSet and deletes no Machine,
  and the Machines are at the target once CAPI reconciles the unpaused objects; a Machine
  version written back afterwards (as CAPI v1.12's MachineSet controller does from a stale
  cache) is moved to the target again, with no MachineSet created and no node restarted.
* OnDelete, as Cluster API defines it (no maxUnavailable, Machines replaced only when
  deleted): the version written unpaused (the worker bootstrap template's too), no node
  upgraded in place, CAPI replaces only the Machine the user deletes, with a bootstrap
  config on the target.

The providers are played through their contracts (``ProviderPlayer``); the
K0sControlPlane is a stand-in with no Machines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.cli.upgrade import apply_upgrade
from fleet.config.models import FleetConfig
from fleet.kube import KubeClient
from fleet.kube.resources import (
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
)
from fleet.planner import conditions as C
from fleet.testing.capi import create_capi_cluster
from fleet.testing.capimanager import CapiEnvs, capi_versions
from fleet.testing.providers import K0S_WORKER_CONFIGS, ProviderPlayer
from fleet.testing.releases import ReleaseServer
from fleet.testing.world import World
from fleet.world.model import ANN_CAPI_PAUSED, ANN_PAUSED_FOR, ANN_WRITTEN_VERSION
from tests.helpers.capienv import capi_namespace, playing, provisioned, wait_for
from tests.helpers.controller import acted_on_current_state, running_controller
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"


def fleet_config(namespace: str, download: str, digest: str) -> FleetConfig:
    deadline = "60s"
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": download, "digests": {V2: {"amd64": digest}}},
        "agent": {"drainTimeout": "20s", "verifyTimeout": "20s"},
        "rollout": {"progressDeadlines": {k: deadline for k in (
            "pending", "downloading", "cordoning", "applyingUpdate", "restarting",
            "verifying", "unCordoning")}},
    })


def cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype), {})


def anns(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


async def linked(mgmt: KubeClient, ns: str, count: int) -> list[dict[str, Any]] | None:
    ms = [m for m in (await mgmt.list(MACHINES, ns)).items
          if ((m.get("status") or {}).get("nodeRef") or {}).get("name")
          and not m["metadata"].get("deletionTimestamp")]
    return ms if len(ms) == count else None


async def _state(mgmt: KubeClient, ns: str) -> dict[str, Any]:
    """What the objects say (for a failure message)."""
    mds = (await mgmt.list(MACHINE_DEPLOYMENTS, ns)).items
    return {
        "machineDeployments": {o["metadata"]["name"]: (
            o["spec"]["template"]["spec"].get("version"), anns(o),
            [(c.get("type"), c.get("status"), c.get("message"))
             for c in (o.get("status") or {}).get("conditions") or []
             if str(c.get("type")).startswith("K0sFleet")]) for o in mds},
        "machineSets": {o["metadata"]["name"]: (
            o["spec"].get("replicas"), o["spec"]["template"]["spec"].get("version"), anns(o))
            for o in (await mgmt.list(MACHINE_SETS, ns)).items},
        "machines": {o["metadata"]["name"]: (o["spec"].get("version"),
                                             o["metadata"].get("deletionTimestamp"))
                     for o in (await mgmt.list(MACHINES, ns)).items},
        "nodePlans": {o["metadata"]["name"]: ((o.get("status") or {}).get("phase"),
                                              (o.get("status") or {}).get("message"))
                      for o in (await mgmt.list(NODE_PLANS, ns)).items},
    }


@pytest.mark.parametrize("version", capi_versions())
async def test_the_paused_md_executor_upgrades_in_place_next_to_the_real_capi(
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, short_tmp: Path,
        version: str) -> None:
    env = await capi_envs.get(version)
    mgmt = env.client
    kubeconfig = crds_installed["wl1"].kubeconfig()
    async with capi_namespace(env) as ns, ReleaseServer() as rs:
        old, new = rs.add(V1), rs.add(V2)
        config = fleet_config(ns, rs.base_url + "/k0s/{version}?arch={arch}", new.sha256)
        async with provisioned(mgmt, ns, wl=wl1, kubeconfig=kubeconfig, root=short_tmp,
                               initial=old) as farm:
            cluster = await create_capi_cluster(
                mgmt, kubeconfig, namespace=ns, name=unique("c"), version=V1, workers=3,
                max_unavailable=1, max_surge=0, control_plane_replicas=0)
            machines = await wait_for("3 Machines linked to Nodes",
                                      lambda: linked(mgmt, ns, 3))
            before = {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines}
            sets_before = {s["metadata"]["name"]
                           for s in (await mgmt.list(MACHINE_SETS, ns)).items}
            async with running_controller(mgmt, config) as controller:
                await apply_upgrade(mgmt, namespace=ns, name="to-v2", version=V2,
                                    selector=None)

                async def released() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                    sets = (await mgmt.list(MACHINE_SETS, ns)).items
                    return (md["spec"]["template"]["spec"]["version"] == V2
                            and anns(md).get(ANN_WRITTEN_VERSION) == V2
                            and ANN_CAPI_PAUSED not in anns(md)
                            and all(ANN_CAPI_PAUSED not in anns(s) for s in sets)
                            and cond(md, C.UP_TO_DATE).get("status") == "True")

                try:
                    await wait_for("the MachineDeployment upgraded and released",
                                   released, timeout=600)
                except AssertionError as e:
                    raise AssertionError(f"{e}; {await _state(mgmt, ns)}") from None

                # CAPI reconciles the unpaused MD and MachineSet: wait (the controller
                # still running, as it does in production) until its status has seen
                # their last generation and nothing is paused. CAPI v1.12's MachineSet
                # controller can force-apply a Machine's old spec.version from a stale
                # cache after the release; the controller then moves it again
                # (docs/capi.md), so the Machines are read once that is done.
                async def capi_caught_up() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                    sets = (await mgmt.list(MACHINE_SETS, ns)).items
                    machines = (await mgmt.list(MACHINES, ns)).items
                    return (all((o.get("status") or {}).get("observedGeneration")
                                == o["metadata"]["generation"]
                                and ANN_CAPI_PAUSED not in anns(o) for o in [md, *sets])
                            and {m["spec"]["version"] for m in machines} == {V2}
                            # CAPI may move a written-back Machine itself (its MachineSet's
                            # template is at the target) while the controller, having seen
                            # the old version, pauses the MachineSet to repair it: done
                            # once the controller has decided on what is there now (its
                            # pause released; CI once stopped it in between).
                            and await acted_on_current_state(
                                controller, mgmt, ns,
                                [MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES]))

                try:
                    await wait_for("CAPI to observe the unpaused objects, every Machine "
                                   "at the target", capi_caught_up)
                    # What CAPI v1.12 did once (a full suite, by chance): a Machine's old
                    # version written back after the release. The controller moves it
                    # again; CAPI replaces nothing for it (asserted below).
                    await mgmt.patch(MACHINES, sorted(before)[0], {"spec": {"version": V1}},
                                     ns)
                    await wait_for("the Machine written back moved to the target again",
                                   capi_caught_up)
                except AssertionError as e:
                    raise AssertionError(f"{e}; {await _state(mgmt, ns)}") from None
            for n in farm.nodes.values():
                assert await n.running_version() == V2, (n.name, n.history)

        machines = (await mgmt.list(MACHINES, ns)).items
        sets_after = {s["metadata"]["name"] for s in (await mgmt.list(MACHINE_SETS, ns)).items}
        state = {m["metadata"]["name"]: (m["spec"]["version"],
                                         m["metadata"].get("deletionTimestamp"))
                 for m in machines}
        assert sets_after == sets_before, f"CAPI created a MachineSet: {sets_after}"
        assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == before, state
        assert not any(m["metadata"].get("deletionTimestamp") for m in machines), state
        assert {m["spec"]["version"] for m in machines} == {V2}, state
        [ms] = (await mgmt.list(MACHINE_SETS, ns)).items
        assert ms["spec"]["template"]["spec"]["version"] == V2
        assert ANN_PAUSED_FOR not in anns(ms)
        plans = (await mgmt.list(NODE_PLANS, ns)).items
        assert sorted(p["spec"]["machineName"] for p in plans) == sorted(before)
        assert {p["status"]["phase"] for p in plans} == {"Completed"}
        for n in farm.nodes.values():
            assert n.restarts == 1, (n.name, n.history)


@pytest.mark.parametrize("version", capi_versions())
async def test_an_on_delete_md_is_left_to_cluster_api_as_it_defines_on_delete(
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, version: str) -> None:
    """``strategy.type: OnDelete`` has no maxUnavailable in Cluster API (0): it replaces a
    Machine only once someone deletes it. Under a FleetUpgrade the controller writes the
    MachineDeployment's version unpaused and upgrades no node in place; the real CAPI then
    creates the new MachineSet at 0 replicas and deletes nothing; a Machine the user
    deletes is replaced by one at the target, the others are left as they are."""
    env = await capi_envs.get(version)
    mgmt = env.client
    kubeconfig = crds_installed["wl1"].kubeconfig()

    async def workload(_ns: str, _cluster: str) -> KubeClient:
        return wl1

    async with capi_namespace(env) as ns, playing(
            ProviderPlayer(mgmt, workload, namespace=ns)):
        config = fleet_config(ns, "https://releases.invalid/k0s/{version}-{arch}", "0" * 64)
        cluster = await create_capi_cluster(
            mgmt, kubeconfig, namespace=ns, name=unique("od"), version=V1, workers=2,
            strategy="OnDelete", control_plane_replicas=0, worker_template_version=V1)
        machines = await wait_for("2 Machines linked to Nodes", lambda: linked(mgmt, ns, 2))
        before = {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines}
        [old_set] = (await mgmt.list(MACHINE_SETS, ns)).items
        async with running_controller(mgmt, config):
            await apply_upgrade(mgmt, namespace=ns, name="to-v2", version=V2, selector=None)

            async def written() -> dict[str, Any] | None:
                md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                ok = (md["spec"]["template"]["spec"]["version"] == V2
                      and anns(md).get(ANN_WRITTEN_VERSION) == V2
                      and cond(md, C.IN_PLACE).get("reason") == C.R_MAX_UNAVAILABLE_ZERO
                      and (md.get("status") or {}).get("observedGeneration")
                      == md["metadata"]["generation"])
                return md if ok else None

            md = await wait_for("the version written and seen by CAPI", written)

            async def template_written() -> bool:
                tpl = await mgmt.get(K0S_WORKER_CONFIG_TEMPLATES, cluster.worker_template, ns)
                return (tpl["spec"]["template"]["spec"].get("version") == V2
                        and anns(tpl).get(ANN_WRITTEN_VERSION) == V2)

            await wait_for("the worker template's version written", template_written)
            # Written unpaused: Cluster API is the driver here.
            assert ANN_CAPI_PAUSED not in anns(md) and ANN_PAUSED_FOR not in anns(md)
            assert cond(md, C.IN_PLACE)["status"] == "False"
            assert "OnDelete" in cond(md, C.IN_PLACE)["message"]

            async def new_set() -> dict[str, Any] | None:
                sets = [s for s in (await mgmt.list(MACHINE_SETS, ns)).items
                        if s["metadata"]["name"] != old_set["metadata"]["name"]]
                return sets[0] if len(sets) == 1 else None

            created = await wait_for("CAPI's new MachineSet", new_set)
            assert created["spec"]["template"]["spec"]["version"] == V2
            assert created["spec"].get("replicas") == 0
            # Nothing deleted, nothing upgraded in place.
            machines = (await mgmt.list(MACHINES, ns)).items
            assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == before
            assert not any(m["metadata"].get("deletionTimestamp") for m in machines)
            assert {m["spec"]["version"] for m in machines} == {V1}
            assert (await mgmt.list(NODE_PLANS, ns)).items == []

            # The control plane first (k0s-fleet wrote its version too). The stand-in KCP
            # has no Machines: play k0smotron's status.version for a control plane on V2
            # (CAPI's MachineSet preflight check ControlPlaneIsStable creates no Machine
            # while the control plane's spec.version is ahead of its status.version).
            async def kcp_written() -> bool:
                kcp = await mgmt.get(K0S_CONTROL_PLANES, cluster.kcp, ns)
                return kcp["spec"]["version"] == V2 and ANN_CAPI_PAUSED not in anns(kcp)

            await wait_for("the K0sControlPlane's version written and released", kcp_written)
            await mgmt.patch(K0S_CONTROL_PLANES, cluster.kcp, {"status": {"version": V2}}, ns,
                             subresource="status")
            # The user deletes one Machine: CAPI replaces it with one on the target.
            gone, kept = sorted(before)
            await mgmt.delete(MACHINES, gone, ns)

            async def replaced() -> list[dict[str, Any]] | None:
                now = await linked(mgmt, ns, 2)
                return now if now and gone not in {
                    m["metadata"]["name"] for m in now} else None

            machines = await wait_for("CAPI to replace the deleted Machine", replaced,
                                      timeout=180)
            versions = {m["metadata"]["name"]: m["spec"]["version"] for m in machines}
            assert versions.pop(kept) == V1, versions
            assert list(versions.values()) == [V2], versions
            # k0smotron installs the bootstrap config's version on the new Machine: CAPI
            # cloned it from the worker template, which k0s-fleet kept in step with the MD.
            new = next(m for m in machines if m["metadata"]["name"] != kept)
            config_ref = new["spec"]["bootstrap"]["configRef"]
            assert config_ref["kind"] == K0S_WORKER_CONFIGS.kind
            boot = await mgmt.get(K0S_WORKER_CONFIGS, config_ref["name"], ns)
            assert boot["spec"]["version"] == V2, boot["spec"]
            kept_now = next(m for m in machines if m["metadata"]["name"] == kept)
            assert kept_now["metadata"]["uid"] == before[kept]
            # the one CAPI created, counted by what its node reports
            async def one_of_two() -> bool:
                md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                return f"1/2 machines on {V2}" in (cond(md, C.UP_TO_DATE).get("message")
                                                    or "")

            await wait_for("the MachineDeployment to count 1/2 up to date", one_of_two)
        assert (await mgmt.list(NODE_PLANS, ns)).items == []
        for node in (await wl1.list(NODES)).items:
            if node["metadata"]["name"] in before:
                assert not any(k.startswith("fleet.k0s-fleet.io/signal")
                               for k in node["metadata"].get("annotations") or {})
