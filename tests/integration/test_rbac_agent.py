"""The agent chart's identity is enough to upgrade a node, and refused everything else.

The chart is installed with helm into a workload API server; the agent then runs as the
chart's ServiceAccount with a token bound to a Pod of the chart's DaemonSet on the
node, exactly as a kubelet-projected token would be (TokenRequest, bound to the Pod, so
the token names the pod's node). The agent is the real ``k0s-fleet agent`` process of a
simulated node (:mod:`fleet.testing.simnode`) and completes an in-place upgrade with that
identity. Then the same identity is shown what it may not do.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from fleet.contract.signal import (
    HAPPY_PATH,
    SIGNAL_DATA_KEY,
    SIGNAL_VERSION,
    SIGNAL_VERSION_KEY,
    K0sUpdateCommand,
    SignalCommand,
    SignalData,
    SignalState,
    SignalStatus,
    replace_status,
    utcnow,
)
from fleet.kube import ForbiddenError, KubeClient
from fleet.kube.resources import (
    AUTOPILOT_PLANS,
    CONTROL_NODES,
    CRDS,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    SERVICE_ACCOUNTS,
    Resource,
)
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World
from tests.helpers.charts import (
    AGENT_CHART,
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    DAEMONSETS,
    create_namespace,
    helm_cli,
    kubeconfig_file,
    pod_spec,
)
from tests.helpers.names import unique
from tests.helpers.pods import controlled
from tests.helpers.rbac import (
    AUDIENCE,
    AgentInstall,
    agent_pod_on,
    service_account_token,
    token_for,
)

pytestmark = pytest.mark.anyio

OLD = "v1.31.3+k0s.0"
NEW = "v1.32.1+k0s.0"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"




@pytest.fixture(scope="module")
async def releases() -> AsyncIterator[ReleaseServer]:
    async with ReleaseServer() as rs:
        rs.add(OLD)
        rs.add(NEW, size=4 * 1024 * 1024)
        yield rs


VAP_BINDINGS = Resource("admissionregistration.k8s.io", "v1",
                        "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
                        namespaced=False)


@pytest.fixture(scope="module")
async def agent_install(crds_installed: World, wl1: KubeClient,
                        tmp_path_factory: pytest.TempPathFactory
                        ) -> AsyncIterator[AgentInstall]:
    """The agent chart, installed with helm (defaults) into a privileged namespace, and
    uninstalled after the module: its admission policies bind cluster-wide (every Node of
    the shared workload API server), and the signal policy lets only this release's
    identity write a node's status, which would refuse the other modules' agents."""
    ns, release = unique("kfa-rbac"), unique("k0s-fleet-agent")
    await create_namespace(wl1, ns, pod_security="privileged")
    kubeconfig = kubeconfig_file(crds_installed["wl1"], tmp_path_factory.mktemp("helm"))
    await helm_cli("install", release, AGENT_CHART, "--namespace", ns, "--kubeconfig",
                   kubeconfig)
    ds = await wl1.get(DAEMONSETS, release, ns)
    yield AgentInstall(ns, release, pod_spec(ds)["serviceAccountName"], ds)
    await helm_cli("uninstall", release, "--namespace", ns, "--kubeconfig", kubeconfig,
                   "--wait")
    with anyio.fail_after(60):
        while any(str(b["metadata"]["name"]).startswith(release)
                  for b in (await wl1.list(VAP_BINDINGS)).items):
            await anyio.sleep(0.1)






async def whoami(client: KubeClient) -> dict[str, Any]:
    review = await client.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                  body={"apiVersion": "authentication.k8s.io/v1",
                                        "kind": "SelfSubjectReview"})
    return review["status"]["userInfo"]  # type: ignore[no-any-return]


async def test_agent_upgrades_its_node_with_the_chart_identity(
        crds_installed: World, wl1: KubeClient, agent_install: AgentInstall,
        releases: ReleaseServer, tmp_path: Path) -> None:
    server = crds_installed["wl1"]
    name = unique("rbac-node")
    async with SimNode.running(wl1, server.kubeconfig(), tmp_path / "node",
                               releases.releases[OLD], name=name, start_agent=False) as node:
        pod = await agent_pod_on(wl1, agent_install, name)
        token = await token_for(wl1, agent_install, pod)
        kubeconfig = tmp_path / "agent.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(server.kubeconfig(token=token,
                                                               user="k0s-fleet-agent")))
        async with await server.client(token=token) as agent:
            who = await whoami(agent)
        assert who["username"] == (f"system:serviceaccount:{agent_install.namespace}:"
                                   f"{agent_install.service_account}")
        assert who["extra"][NODE_NAME_CLAIM] == [name]
        # A workload pod that the drain must evict (the agent's own pod is exempt).
        victim = unique("victim")
        await wl1.create(PODS, {"metadata": {"name": victim, "ownerReferences": controlled()},
                                "spec": {
            "nodeName": name, "containers": [{"name": "c", "image": "busybox"}]}}, "default")

        await node.start_agent(extra_args=["--kubeconfig", str(kubeconfig)])
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, {s for s in SignalState if s.terminal}, timeout=90)
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, (sig.status.reason, node.log_text())
        assert node.states(plan) == [str(s) for s in HAPPY_PATH]
        assert await node.running_version() == NEW
        assert await wl1.get_or_none(PODS, victim, "default") is None  # evicted
        assert await wl1.get_or_none(PODS, pod["metadata"]["name"], agent_install.namespace)
        assert "Forbidden" not in node.log_text() and " 403" not in node.log_text()


@pytest.fixture
async def agent_client(crds_installed: World, wl1: KubeClient, agent_install: AgentInstall
                       ) -> AsyncIterator[tuple[KubeClient, str, str]]:
    """(agent identity client, its node, another node)."""
    mine, other = unique("own-node"), unique("other-node")
    for n in (mine, other):
        await wl1.create(NODES, {"metadata": {"name": n}})
    pod = await agent_pod_on(wl1, agent_install, mine)
    token = await token_for(wl1, agent_install, pod)
    async with await crds_installed["wl1"].client(token=token) as c:
        yield c, mine, other
    for n in (mine, other):
        with contextlib.suppress(Exception):
            await wl1.delete(NODES, n)


async def test_agent_may_touch_only_its_own_node(
        agent_client: tuple[KubeClient, str, str]) -> None:
    agent, mine, other = agent_client
    ann = {"metadata": {"annotations": {"fleet.k0s-fleet.io/probe": "x"}}}
    # What the agent does: watch its Node by name, patch it (signal status, cordon).
    listed = await agent.list(NODES, field_selector=f"metadata.name={mine}")
    assert [n["metadata"]["name"] for n in listed.items] == [mine]
    await agent.patch(NODES, mine, ann)
    await agent.patch(NODES, mine, {"spec": {"unschedulable": True}})
    # RBAC allows `patch nodes`; the chart's admission policy narrows it to its own Node.
    with pytest.raises(ForbiddenError, match="may only modify the Node its pod runs on"):
        await agent.patch(NODES, other, ann)
    with pytest.raises(ForbiddenError, match="may only modify the Node its pod runs on"):
        await agent.patch(NODES, other, {"spec": {"unschedulable": True}})
    with pytest.raises(ForbiddenError):
        await agent.delete(NODES, mine)
    with pytest.raises(ForbiddenError):
        await agent.patch(NODES, mine, {"status": {"capacity": {"pods": "1"}}},
                          subresource="status")


async def test_agent_token_without_a_node_is_refused_node_writes(
        crds_installed: World, wl1: KubeClient, agent_install: AgentInstall) -> None:
    """Fail closed: a token of the agent's ServiceAccount that names no node (not a pod's
    projected token) may still read, but not modify any Node."""
    node = unique("unbound-node")
    await wl1.create(NODES, {"metadata": {"name": node}})
    token = await token_for(wl1, agent_install, None)
    async with await crds_installed["wl1"].client(token=token) as agent:
        assert NODE_NAME_CLAIM not in (await whoami(agent)).get("extra", {})
        await agent.get(NODES, node)
        with pytest.raises(ForbiddenError, match="may only modify the Node its pod runs on"):
            await agent.patch(NODES, node, {"metadata": {"labels": {"x": "y"}}})


async def test_agent_is_refused_everything_else(
        wl1: KubeClient, agent_client: tuple[KubeClient, str, str]) -> None:
    agent, mine, _ = agent_client
    ns = unique("agent-denied")
    await create_namespace(wl1, ns)
    await wl1.create(SECRETS, {"metadata": {"name": "s"}, "stringData": {"k": "v"}}, ns)
    pod = await wl1.create(PODS, {"metadata": {"name": "p"}, "spec": {
        "nodeName": mine, "containers": [{"name": "c", "image": "busybox"}]}}, ns)

    # Drain needs exactly: list pods (by node), create evictions.
    on_node = await agent.list(PODS, field_selector=f"spec.nodeName={mine}")
    assert "p" in {p["metadata"]["name"] for p in on_node.items}

    label = {"metadata": {"labels": {"x": "y"}}}
    busybox = {"containers": [{"name": "c", "image": "busybox"}]}
    denied: dict[str, Callable[[], Awaitable[Any]]] = {
        "get secret": lambda: agent.get(SECRETS, "s", ns),
        "list secrets": lambda: agent.list(SECRETS),
        "list secrets in namespace": lambda: agent.list(SECRETS, ns),
        "get pod": lambda: agent.get(PODS, "p", ns),
        "delete pod": lambda: agent.delete(PODS, "p", ns),
        "create pod": lambda: agent.create(PODS, {"metadata": {"name": "q"}, "spec": busybox},
                                           ns),
        "patch pod": lambda: agent.patch(PODS, "p", label, ns),
        "patch namespace": lambda: agent.patch(NAMESPACES, ns, label),
        "patch clusterrole": lambda: agent.patch(CLUSTER_ROLES, "view", label),
        "patch CRD": lambda: agent.patch(CRDS, "nodeplans.fleet.k0s-fleet.io", label),
        "list controlnodes": lambda: agent.list(CONTROL_NODES),
        "create autopilot plan": lambda: agent.create(
            AUTOPILOT_PLANS, {"metadata": {"name": "autopilot"}, "spec": {}}),
        "create serviceaccount token": lambda: agent.create_subresource(
            SERVICE_ACCOUNTS, "default", "token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"audiences": [AUDIENCE]}}, ns),
    }
    allowed = []
    for what, call in denied.items():
        try:
            await call()
        except ForbiddenError:
            continue
        allowed.append(what)
    assert allowed == []
    # The eviction itself is allowed (a Pod's deletion through the Eviction API).
    await agent.create_subresource(PODS, "p", "eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "p", "namespace": ns},
        "deleteOptions": {"preconditions": {"uid": pod["metadata"]["uid"]}}}, ns)
    assert (await wl1.get(PODS, "p", ns))["metadata"].get("deletionTimestamp")


# -- who may write the request part of the signal -------------------------------------------
SIGNAL_DENIED = "only the k0s-fleet controller may"
STATUS_DENIED = "only the k0s-fleet controller and the agent of"


def ann(**values: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": values}}


def a_request() -> SignalData:
    return SignalData(
        planId=unique("plan"), created=utcnow(), traceparent=None,
        command=SignalCommand(id=1, k0supdate=K0sUpdateCommand(
            url="https://get.k0sproject.io/v1.32.1+k0s.0/k0s-v1.32.1+k0s.0-amd64",
            version=NEW, sha256="a" * 64)))


async def signal_policy_in_force(admin: KubeClient, writer: KubeClient, node: str,
                                 timeout: float = 60.0) -> None:
    """Until the API server refuses ``writer`` a signal write on ``node`` (an admission
    policy takes effect some time after its creation: the API server loads it
    asynchronously). A probe write that still lands is undone by the admin."""
    probe = ann(**{SIGNAL_DATA_KEY: a_request().to_json()})
    with anyio.fail_after(timeout):
        while True:
            try:
                await writer.patch(NODES, node, probe)
            except ForbiddenError:
                return
            await admin.patch(NODES, node, ann(**{SIGNAL_DATA_KEY: None}))
            await anyio.sleep(0.2)


async def test_only_the_controller_identity_may_write_the_request(
        wl1: KubeClient, agent_client: tuple[KubeClient, str, str]) -> None:
    """The chart's signal policy: the agent's identity (any identity but the controller's,
    here the admin token in system:masters) may replace the status of its own Node's
    signal, and nothing of the request: not the URL, not the digest, not the signal
    version, not a fresh request, not a second "command" smuggled after the status."""
    agent, mine, _ = agent_client
    request = a_request()
    raw = request.to_json()

    # Not even a request of its own making on a Node without one (once the freshly
    # installed policy is in force: the API server loads it asynchronously).
    await signal_policy_in_force(wl1, agent, mine)
    with pytest.raises(ForbiddenError, match=SIGNAL_DENIED):
        await agent.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: raw}))
    # The controller (admin, system:masters) writes the request.
    await wl1.patch(NODES, mine, ann(**{SIGNAL_VERSION_KEY: SIGNAL_VERSION,
                                        SIGNAL_DATA_KEY: raw}))
    # The agent's own status write lands: request part byte for byte, status replaced.
    status = replace_status(raw, SignalStatus(status=SignalState.DOWNLOADING,
                                              reason="a reason with {braces} and \"quotes\""))
    await agent.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: status}))
    later = replace_status(status, SignalStatus(status=SignalState.CORDONING, sha256="a" * 64))
    await agent.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: later}))

    evil_url = later.replace("https://get.k0sproject.io/", "https://evil.example/")
    evil_digest = later.replace("a" * 64, "b" * 64, 1)
    smuggled = later[:-1] + ',"command":{"id":1,"k0supdate":{"url":"https://evil.example/k0s",' \
        f'"version":"{NEW}","sha256":"{"b" * 64}"}}}}}}'
    refused = {
        "another URL": ann(**{SIGNAL_DATA_KEY: evil_url}),
        "another digest": ann(**{SIGNAL_DATA_KEY: evil_digest}),
        "a second command after the status": ann(**{SIGNAL_DATA_KEY: smuggled}),
        "a new request": ann(**{SIGNAL_DATA_KEY: raw.replace(request.planId, "other")}),
        "withdrawing the request": ann(**{SIGNAL_DATA_KEY: None}),
        "the signal version": ann(**{SIGNAL_VERSION_KEY: "v9"}),
    }
    landed = []
    for what, patch in refused.items():
        try:
            await agent.patch(NODES, mine, patch)
        except ForbiddenError as e:
            assert SIGNAL_DENIED in str(e), (what, e)
            continue
        landed.append(what)
    assert landed == []
    current = (await wl1.get(NODES, mine))["metadata"]["annotations"]
    assert current[SIGNAL_DATA_KEY] == later and current[SIGNAL_VERSION_KEY] == SIGNAL_VERSION
    # Other annotations stay the agent's to write (cordon mark, running version).
    await agent.patch(NODES, mine, ann(**{"fleet.k0s-fleet.io/k0s-version": NEW}))
    # ... and the controller may replace or withdraw its request.
    await wl1.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: evil_url}))
    await wl1.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: None, SIGNAL_VERSION_KEY: None}))


@pytest.fixture
async def intruder(crds_installed: World, wl1: KubeClient, agent_install: AgentInstall
                   ) -> AsyncIterator[KubeClient]:
    """Another identity allowed to patch Nodes (what the kubelet, node-problem-detector or
    many operators hold), not the controller's, not an agent's."""
    ns, name = agent_install.namespace, unique("intruder")
    await wl1.create(SERVICE_ACCOUNTS, {"metadata": {"name": name}}, ns)
    await wl1.create(CLUSTER_ROLES, {"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]})
    await wl1.create(CLUSTER_ROLE_BINDINGS, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]})
    token = await service_account_token(wl1, ns, name)
    async with await crds_installed["wl1"].client(token=token) as c:
        yield c
    for res, obj in ((CLUSTER_ROLE_BINDINGS, name), (CLUSTER_ROLES, name)):
        with contextlib.suppress(Exception):
            await wl1.delete(res, obj)


async def test_only_the_nodes_own_agent_may_write_the_status(
        wl1: KubeClient, agent_client: tuple[KubeClient, str, str],
        intruder: KubeClient) -> None:
    """The status member: another identity with `patch nodes` may not forge one (a later
    step, another digest, a 1970 timestamp, a drain or restart, a status removed), and
    the agent of one node may not write another node's; the node's own agent may."""
    agent, mine, other = agent_client
    await signal_policy_in_force(wl1, intruder, mine)
    raw = a_request().to_json()
    await wl1.patch(NODES, mine, ann(**{SIGNAL_VERSION_KEY: SIGNAL_VERSION,
                                        SIGNAL_DATA_KEY: raw}))
    downloading = replace_status(raw, SignalStatus(status=SignalState.DOWNLOADING))
    await agent.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: downloading}))  # its own agent

    forged = {
        "a later step": SignalStatus(status=SignalState.RESTARTING, restarted=True),
        "another digest": SignalStatus(status=SignalState.APPLYING_UPDATE, sha256="b" * 64),
        "a 1970 timestamp": SignalStatus(status=SignalState.VERIFYING,
                                         timestamp=datetime(1970, 1, 1, tzinfo=UTC)),
        "a drain": SignalStatus(status=SignalState.CORDONING),
        "an outcome": SignalStatus(status=SignalState.COMPLETED),
    }
    landed = []
    for what, status in forged.items():
        try:
            await intruder.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: replace_status(
                downloading, status)}))
        except ForbiddenError as e:
            assert STATUS_DENIED in str(e) and mine in str(e), (what, e)
            continue
        landed.append(what)
    try:  # the status removed: the request part alone
        await intruder.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: raw}))
        landed.append("the status removed")
    except ForbiddenError as e:
        assert STATUS_DENIED in str(e), e
    assert landed == []
    current = (await wl1.get(NODES, mine))["metadata"]["annotations"]
    assert current[SIGNAL_DATA_KEY] == downloading
    # other annotations and the cordon stay writable to such an identity (RBAC decides)
    await intruder.patch(NODES, mine, ann(**{"example.com/probe": "x"}))

    # The agent of `mine` may not write the status of `other`'s signal (the own-node
    # policy already refuses it any write there; the signal policy says why, too).
    await wl1.patch(NODES, other, ann(**{SIGNAL_VERSION_KEY: SIGNAL_VERSION,
                                         SIGNAL_DATA_KEY: raw}))
    with pytest.raises(ForbiddenError):
        await agent.patch(NODES, other, ann(**{SIGNAL_DATA_KEY: downloading}))
    # the controller (admin) may write a status, as it may write anything there
    await wl1.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: replace_status(
        downloading, SignalStatus(status=SignalState.CORDONING))}))
    await wl1.patch(NODES, mine, ann(**{SIGNAL_DATA_KEY: None, SIGNAL_VERSION_KEY: None}))


async def test_the_own_node_policy_covers_create(
        wl1: KubeClient, agent_install: AgentInstall,
        agent_client: tuple[KubeClient, str, str]) -> None:
    """Were the agent's identity granted `create nodes` (an extra role someone adds), it
    still could not register a Node under another name than its own."""
    agent, mine, _ = agent_client
    name = unique("grant-create")
    await wl1.create(CLUSTER_ROLES, {"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create"]}]})
    await wl1.create(CLUSTER_ROLE_BINDINGS, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": agent_install.service_account,
                      "namespace": agent_install.namespace}]})
    stranger = unique("stranger-node")
    try:
        with anyio.fail_after(60):  # until RBAC grants it (the authorizer's cache)
            while True:
                try:
                    await agent.create(NODES, {"metadata": {"name": stranger}})
                except ForbiddenError as e:
                    if "may only modify the Node its pod runs on" in str(e):
                        break
                    await anyio.sleep(0.2)
                    continue
                raise AssertionError(f"the agent of {mine} created the Node {stranger}")
        assert await wl1.get_or_none(NODES, stranger) is None
    finally:
        for res, obj in ((CLUSTER_ROLE_BINDINGS, name), (CLUSTER_ROLES, name)):
            with contextlib.suppress(Exception):
                await wl1.delete(res, obj)
        with contextlib.suppress(Exception):
            await wl1.delete(NODES, stranger)
