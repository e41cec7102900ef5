"""One trace per node upgrade, read back from a real Jaeger (fleet.testing.jaeger).

The controller (in-process, exporting OTLP/HTTP) dispatches; real agent processes on
simulated nodes export to the same Jaeger, configured once through flags and once only
through the standard OTEL_* environment. The trees are asserted through Jaeger's query
API: dispatch -> agent.upgrade -> one span per step, across processes, across an agent
killed in the middle of its drain, and with the failure on a failed upgrade.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fleet.config.models import FleetConfig
from fleet.contract.signal import HAPPY_PATH, SignalState
from fleet.kube import KubeClient
from fleet.kube.resources import NAMESPACES, NODE_PLANS, PDBS, PODS
from fleet.telemetry import TracingOptions, current_traceparent, get_tracer, setup_tracing
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd
from fleet.testing.jaeger import Jaeger, TraceSpan
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World
from tests.helpers.controller import running_controller, wait_rollout
from tests.helpers.names import unique
from tests.helpers.pods import controlled

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
STEPS = ["agent.Start", *(f"agent.{s}" for s in HAPPY_PATH[:-1])]
TERMINAL = {s for s in SignalState if s.terminal}


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    with Jaeger(tmp_path_factory.mktemp("jaeger")) as j:
        yield j


@pytest.fixture(scope="module")
async def releases() -> AsyncIterator[ReleaseServer]:
    async with ReleaseServer() as rs:
        rs.add(V1)
        rs.add(V2, size=2 * 1024 * 1024)
        yield rs


@pytest.fixture
async def trace_ns(wl1: KubeClient) -> AsyncIterator[str]:
    name = unique("traces")
    await wl1.create(NAMESPACES, {"metadata": {"name": name}})
    yield name
    await wl1.delete(NAMESPACES, name)


def tree(spans: list[TraceSpan]) -> dict[str, list[TraceSpan]]:
    out: dict[str, list[TraceSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def agent_upgrade_complete(spans: list[TraceSpan]) -> bool:
    names = {s.name for s in spans}
    return "agent.upgrade" in names and set(STEPS) <= names


@contextlib.contextmanager
def dispatch_span(jaeger: Jaeger) -> Iterator[str]:
    """A stand-in for the controller's dispatch span (its own process's provider)."""
    provider = setup_tracing(TracingOptions(otlp_endpoint=jaeger.otlp_endpoint,
                                            service_name="dispatch-test"))
    try:
        with get_tracer("test", provider).start_as_current_span("node-upgrade.dispatch"):
            tp = current_traceparent()
        assert tp is not None
        yield tp
    finally:
        provider.shutdown()


async def test_one_upgrade_is_one_trace_from_the_controllers_dispatch(  # noqa: PLR0917
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, namespace: str,
        jaeger: Jaeger, releases: ReleaseServer, tmp_path: Path) -> None:
    await ensure_infra_crd(mgmt)
    kubeconfig = crds_installed["wl1"].kubeconfig()
    fc = await create_cluster(mgmt, wl1, kubeconfig, namespace=namespace, name=unique("tr"),
                              control_planes=1, workers=1, max_unavailable=1, version=V1,
                              create_nodes=False)
    config = FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": releases.base_url + "/k0s/{version}?arch={arch}",
                     "digests": {V2: {"amd64": releases.releases[V2].sha256}}},
        "telemetry": {"otlpEndpoint": jaeger.otlp_endpoint,
                      "serviceName": "k0s-fleet-controller"},
    })
    provider = setup_tracing(config.telemetry)
    # One agent configured by flags, the other only by the standard environment.
    by_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
              "OTEL_SERVICE_NAME": "agent-from-env", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    by_flag = ["--otlp-endpoint", jaeger.otlp_endpoint]
    machines = list(fc.machines)
    try:
        async with contextlib.AsyncExitStack() as stack:
            nodes = [await stack.enter_async_context(SimNode.running(
                wl1, kubeconfig, tmp_path / name, releases.releases[V1], name=name,
                agent_args=by_flag if i == 0 else [],
                agent_env=by_env if i == 1 else None)) for i, name in enumerate(machines)]
            async with running_controller(mgmt, config,
                                          tracer=get_tracer("fleet.controller", provider)):
                await bump(mgmt, fc, V2)
                await wait_rollout(mgmt, fc, timeout=120)
            for node in nodes:
                await node.wait_upgrade_recorded()
                assert await node.stop_agent() == 0  # flushes its spans
    finally:
        provider.shutdown()

    plans = (await mgmt.list(NODE_PLANS, namespace)).items
    assert len(plans) == len(machines)
    services = set()
    for plan in plans:
        tp = plan["status"]["traceparent"]
        trace_id = tp.split("-")[1]
        spans = await jaeger.wait_for_trace(
            trace_id, lambda ss: agent_upgrade_complete(ss)
            and {"node-upgrade.dispatch", "node-upgrade"} <= {s.name for s in ss})
        by = tree(spans)
        (dispatch,) = by["node-upgrade.dispatch"]
        (upgrade,) = by["agent.upgrade"]
        assert dispatch.service == "k0s-fleet-controller" and dispatch.parent_id is None
        assert dispatch.span_id == tp.split("-")[2]
        assert dispatch.tags["k0s_fleet.machine"] == plan["spec"]["machineName"]
        assert dispatch.tags["k0s_fleet.cluster"] == fc.name
        # the OpenTelemetry semantic conventions' names, next to k0s-fleet's own
        assert dispatch.tags["k8s.cluster.name"] == fc.name
        assert dispatch.tags["k8s.namespace.name"] == namespace
        assert dispatch.tags["k8s.node.name"] == plan["spec"]["nodeName"]
        assert dispatch.tags["k0s_fleet.executor"] == "agent"
        # dispatch -> agent.upgrade -> every step, once each
        assert upgrade.parent_id == dispatch.span_id
        assert upgrade.tags["k0s_fleet.outcome"] == "Completed"
        assert upgrade.tags["k0s_fleet.version"] == V2
        assert upgrade.tags["k0s_fleet.previous_version"] == V1
        assert upgrade.tags["k8s.node.name"] == plan["spec"]["nodeName"]
        for step in STEPS:
            (span,) = by[step]
            assert span.parent_id == upgrade.span_id, step
            assert span.service == upgrade.service
        assert by["agent.Downloading"][0].tags["k0s_fleet.download.bytes"] == \
            len(releases.releases[V2].body)
        assert "k0s_fleet.drain.evicted" in by["agent.Cordoning"][0].tags
        # the controller's outcome span joins the same trace under its dispatch
        (outcome,) = by["node-upgrade"]
        assert outcome.parent_id == dispatch.span_id
        assert (outcome.tags["k8s.cluster.name"], outcome.tags["k8s.namespace.name"],
                outcome.tags["k8s.node.name"]) == (fc.name, namespace, plan["spec"]["nodeName"])
        assert {s.name for s in spans} == {*STEPS, "agent.upgrade", "node-upgrade.dispatch",
                                           "node-upgrade"}
        services.add(upgrade.service)
        print(f"trace of {plan['metadata']['name']}: {jaeger.trace_link(trace_id)}")
    assert services == {"k0s-fleet-agent", "agent-from-env"}


async def test_an_agent_killed_mid_drain_continues_the_same_trace(  # noqa: PLR0917
        wl1: KubeClient, crds_installed: World, trace_ns: str, jaeger: Jaeger,
        releases: ReleaseServer, tmp_path: Path) -> None:
    """SIGKILL while a PodDisruptionBudget holds the drain; the next agent process
    resumes the request and its step spans join the same upgrade span."""
    ns = trace_ns
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
    with dispatch_span(jaeger) as tp:
        trace_id, dispatch_id = tp.split("-")[1:3]
    async with SimNode.running(wl1, crds_installed["wl1"].kubeconfig(), tmp_path / "n",
                               releases.releases[V1], agent_args=[
                                   "--otlp-endpoint", jaeger.otlp_endpoint,
                                   "--drain-timeout", "120"], agent_env=env) as node:
        label = unique("held")
        # as in test_agent_upgrade: a budget of minAvailable 1 over the node's only pod
        await wl1.create(PDBS, {"metadata": {"name": label}, "spec": {
            "minAvailable": 1, "selector": {"matchLabels": {"app": label}}}}, ns)
        await wl1.create(PODS, {"metadata": {"name": "held", "labels": {"app": label},
                                             "ownerReferences": controlled()},
                                "spec": {"nodeName": node.name, "containers": [
                                    {"name": "c", "image": "busybox"}]}}, ns)
        # what a kubelet would report: a Pending pod may be evicted whatever its budget says
        await wl1.patch(PODS, "held", {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}]}}, ns, subresource="status")
        plan = await node.request(releases.releases[V2], traceparent=tp)
        await node.wait_for(plan, {SignalState.CORDONING}, timeout=60)
        # what the first process finished is in Jaeger before it dies
        first = await jaeger.wait_for_trace(
            trace_id, lambda ss: {"agent.Start", "agent.Downloading"} <= {s.name for s in ss})
        first_instance = {s.instance for s in first if s.name == "agent.Start"}
        sig = node.signal()
        assert sig is not None and sig.status is not None
        assert sig.status.status is SignalState.CORDONING, "the budget did not hold the drain"
        assert node.agent is not None
        node.agent.kill()  # SIGKILL in the middle of the drain
        await node.wait_agent_exit()
        await wl1.delete(PDBS, label, ns)
        await node.start_agent()
        sig = await node.wait_for(plan, TERMINAL, timeout=90)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED, \
            sig.status.reason
        await node.wait_upgrade_recorded()
        assert await node.stop_agent() == 0

    spans = await jaeger.wait_for_trace(trace_id, agent_upgrade_complete)
    by = tree(spans)
    (upgrade,) = by["agent.upgrade"]
    assert upgrade.parent_id == dispatch_id
    assert all(s.parent_id == upgrade.span_id for s in spans
               if s.name.startswith("agent.") and s is not upgrade)
    instances = {s.instance for s in spans if s.name.startswith("agent.")}
    assert len(instances) == 2 and first_instance < instances  # two processes, one trace
    # the killed process's drain span never ended; the second process drained again
    cordoning = by["agent.Cordoning"]
    assert [s.instance for s in cordoning] == list(instances - first_instance)
    assert upgrade.tags["k0s_fleet.outcome"] == "Completed"


async def test_a_failed_upgrade_trace_carries_the_failure(
        wl1: KubeClient, crds_installed: World, jaeger: Jaeger, releases: ReleaseServer,
        tmp_path: Path) -> None:
    """A digest mismatch: the download step and the upgrade span are errors with the
    reason. Flags win over the environment where both are set (service name)."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
           "OTEL_SERVICE_NAME": "loses-to-the-flag"}
    with dispatch_span(jaeger) as tp:
        trace_id, dispatch_id = tp.split("-")[1:3]
    async with SimNode.running(wl1, crds_installed["wl1"].kubeconfig(), tmp_path / "n",
                               releases.releases[V1], agent_env=env,
                               agent_args=["--otel-service-name", "agent-by-flag"]) as node:
        plan = await node.request(releases.releases[V2], sha256="f" * 64, traceparent=tp)
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None and sig.status.status is SignalState.FAILED_DOWNLOAD
        await node.wait_upgrade_recorded()
        assert await node.stop_agent() == 0

    def failed(ss: list[TraceSpan]) -> bool:
        return {"agent.upgrade", "agent.Downloading"} <= {s.name for s in ss}

    by = tree(await jaeger.wait_for_trace(trace_id, failed))
    (upgrade,), (download,) = by["agent.upgrade"], by["agent.Downloading"]
    assert upgrade.parent_id == dispatch_id and download.parent_id == upgrade.span_id
    assert upgrade.service == "agent-by-flag"
    for span in (upgrade, download):
        assert span.error, span.tags
        assert "sha256 mismatch" in span.tags["k0s_fleet.failure_reason"]
    assert upgrade.tags["k0s_fleet.outcome"] == "FailedDownload"
    assert "agent.Cordoning" not in by
