"""``helm install`` / ``upgrade`` / ``uninstall`` of both charts into real API servers, and
Pod Security admission of the pods they would run.

There is no kubelet, so nothing is waited for (no ``--wait``): these tests check what the
API server accepted and stored. The commands are the ones docs/operations.md gives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from fleet.kube import ForbiddenError, KubeClient
from fleet.kube.resources import CONFIGMAPS, NODES, PODS, SECRETS, SERVICE_ACCOUNTS, Resource
from fleet.testing.world import World
from tests.helpers.charts import (
    AGENT_CHART,
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CLUSTER_WIDE_SECRETS,
    CONTROLLER_CHART,
    DAEMONSETS,
    DEPLOYMENTS,
    FLOW_SCHEMAS,
    PRIORITY_LEVELS,
    ROLE_BINDINGS,
    ROLES,
    Manifest,
    create_namespace,
    helm_cli,
    kubeconfig_file,
    pod_spec,
    render,
)
from tests.helpers.names import unique
from tests.helpers.rbac import service_account_token

pytestmark = pytest.mark.anyio

SERVICES = Resource("", "v1", "services", "Service", namespaced=True)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True)
ADMISSION = "admissionregistration.k8s.io"
VAPS = Resource(ADMISSION, "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                namespaced=False)
VAP_BINDINGS = Resource(ADMISSION, "v1", "validatingadmissionpolicybindings",
                        "ValidatingAdmissionPolicyBinding", namespaced=False)
EXTENSION_CONFIGS = Resource("runtime.cluster.x-k8s.io", "v1beta2", "extensionconfigs",
                             "ExtensionConfig", namespaced=False)
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy",
                            namespaced=True)
KIND_RESOURCES = {r.kind: r for r in (
    DEPLOYMENTS, DAEMONSETS, SERVICES, PDBS, CLUSTER_ROLES, CLUSTER_ROLE_BINDINGS, ROLES,
    ROLE_BINDINGS, VAPS, VAP_BINDINGS, EXTENSION_CONFIGS, CONFIGMAPS, SERVICE_ACCOUNTS,
    FLOW_SCHEMAS, PRIORITY_LEVELS, NETWORK_POLICIES,
)}








async def installed(client: KubeClient, manifest: Manifest) -> list[dict[str, Any]]:
    """Every object of ``manifest`` as the API server stores it (NotFound fails)."""
    out = []
    for d in manifest.docs:
        res = KIND_RESOURCES[d["kind"]]
        meta = d["metadata"]
        out.append(await client.get(res, meta["name"],
                                    meta.get("namespace") if res.namespaced else None))
    return out


async def gone(client: KubeClient, manifest: Manifest) -> list[str]:
    """Names of the objects of ``manifest`` that still exist."""
    left = []
    for d in manifest.docs:
        res = KIND_RESOURCES[d["kind"]]
        meta = d["metadata"]
        obj = await client.get_or_none(res, meta["name"],
                                       meta.get("namespace") if res.namespaced else None)
        if obj is not None and not obj["metadata"].get("deletionTimestamp"):
            left.append(f"{d['kind']}/{meta['name']}")
    return left


@pytest.fixture
async def mgmt_kubeconfig(crds_installed: World, tmp_path: Path) -> Path:
    return kubeconfig_file(crds_installed["mgmt"], tmp_path)


@pytest.fixture
async def wl1_kubeconfig(crds_installed: World, tmp_path: Path) -> Path:
    return kubeconfig_file(crds_installed["wl1"], tmp_path)


# -- controller chart ------------------------------------------------------------------
async def test_controller_chart_install_upgrade_uninstall(
        mgmt: KubeClient, mgmt_kubeconfig: Path, tmp_path: Path) -> None:
    ns, release = unique("kf-sys"), unique("k0s-fleet")
    capi_ns = unique("capi")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"fleet": {
        "clusters": {"namespaces": [capi_ns]},
        "rollout": {"maxConcurrentClusters": 2},
    }}))
    await create_namespace(mgmt, capi_ns)
    # docs/operations.md "Install"
    out = await helm_cli("install", release, CONTROLLER_CHART, "--namespace", ns,
                         "--create-namespace", "--values", values,
                         "--kubeconfig", mgmt_kubeconfig)
    assert "STATUS: deployed" in out
    assert f"deployment/{release}" in out  # NOTES
    manifest = render(CONTROLLER_CHART, values, release=release, namespace=ns,
                      api_versions=[])
    stored = await installed(mgmt, manifest)
    assert {o["kind"] for o in stored} >= {
        "Deployment", "ServiceAccount", "ClusterRole", "Role", "RoleBinding", "ConfigMap",
        "Service", "PodDisruptionBudget", "FlowSchema", "PriorityLevelConfiguration"}
    deploy = await mgmt.get(DEPLOYMENTS, release, ns)
    assert deploy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert deploy["spec"]["replicas"] == 2
    # The controller works (Secrets included) only in the Clusters' namespace: a
    # RoleBinding there, no ClusterRoleBinding; its guard policy is in place.
    await mgmt.get(ROLE_BINDINGS, f"{release}-fleet", capi_ns)
    assert await mgmt.get_or_none(CLUSTER_ROLE_BINDINGS, release) is None
    await mgmt.get(VAPS, f"{release}-guard")
    cm = await mgmt.get(CONFIGMAPS, release, ns)
    assert yaml.safe_load(cm["data"]["fleet.yaml"])["rollout"] == {"maxConcurrentClusters": 2}

    # docs/operations.md "Pause": a values change rolls the pods (config checksum).
    def checksum(d: dict[str, Any]) -> str:
        return str(d["spec"]["template"]["metadata"]["annotations"]["checksum/fleet-config"])

    out = await helm_cli("upgrade", release, CONTROLLER_CHART, "--namespace", ns,
                         "--reuse-values", "--set", "fleet.rollout.paused=true",
                         "--kubeconfig", mgmt_kubeconfig)
    assert "has been upgraded" in out
    cm = await mgmt.get(CONFIGMAPS, release, ns)
    assert yaml.safe_load(cm["data"]["fleet.yaml"])["rollout"] == {
        "maxConcurrentClusters": 2, "paused": True}
    assert checksum(await mgmt.get(DEPLOYMENTS, release, ns)) != checksum(deploy)

    # A typo in an upgrade is refused before anything changes.
    out = await helm_cli("upgrade", release, CONTROLLER_CHART, "--namespace", ns,
                         "--reuse-values", "--set", "fleet.rollout.pased=false",
                         "--kubeconfig", mgmt_kubeconfig, check=False)
    assert "additional properties 'pased' not allowed" in out
    history = await helm_cli("history", release, "--namespace", ns,
                             "--kubeconfig", mgmt_kubeconfig)
    assert len(history.strip().splitlines()) == 3  # header + 2 revisions

    # docs/operations.md "Uninstall"
    out = await helm_cli("uninstall", release, "--namespace", ns,
                         "--kubeconfig", mgmt_kubeconfig)
    assert "uninstalled" in out
    assert await gone(mgmt, manifest) == []
    # The CRD (and so every NodePlan) survives an uninstall: helm never deletes crds/.
    crd = await mgmt.request(
        "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
        "nodeplans.fleet.k0s-fleet.io")
    assert crd["spec"]["group"] == "fleet.k0s-fleet.io"


async def test_controller_chart_with_extension_registers_it(
        mgmt: KubeClient, mgmt_kubeconfig: Path) -> None:
    """ExtensionConfig, Service and TLS wiring land in a cluster with CAPI's runtime SDK."""
    ns, release = unique("kf-ext"), unique("k0s-fleet")
    await helm_cli("install", release, CONTROLLER_CHART, "--namespace", ns,
                   "--create-namespace", "--kubeconfig", mgmt_kubeconfig,
                   "--values", CONTROLLER_CHART / "ci" / "extension-secret-values.yaml",
                   "--set", CLUSTER_WIDE_SECRETS)
    try:
        ext = await mgmt.get(EXTENSION_CONFIGS, release)
        assert ext["spec"]["clientConfig"]["service"] == {
            "name": f"{release}-extension", "namespace": ns, "port": 443}
        svc = await mgmt.get(SERVICES, f"{release}-extension", ns)
        assert svc["spec"]["ports"][0]["targetPort"] == "extension"
        # The NetworkPolicy in front of the extension port: accepted by the API server's
        # validation as rendered, admitting only Cluster API's controller namespace there.
        policy = await mgmt.get(NETWORK_POLICIES, f"{release}-extension", ns)
        deploy = await mgmt.get(DEPLOYMENTS, release, ns)
        assert policy["spec"]["podSelector"] == deploy["spec"]["selector"]
        assert policy["spec"]["ingress"][0] == {
            "from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "capi-system"}}}],
            "ports": [{"port": "extension", "protocol": "TCP"}]}
        # cert-manager is not installed here: the certManager mode says so up front.
        out = await helm_cli("upgrade", release, CONTROLLER_CHART, "--namespace", ns,
                             "--reuse-values", "--set", "extension.tls.mode=certManager",
                             "--kubeconfig", mgmt_kubeconfig, check=False)
        assert "needs cert-manager" in out
    finally:
        await helm_cli("uninstall", release, "--namespace", ns, "--kubeconfig",
                       mgmt_kubeconfig)
    assert await mgmt.get_or_none(EXTENSION_CONFIGS, release) is None


async def test_install_with_a_typo_creates_nothing(
        mgmt: KubeClient, mgmt_kubeconfig: Path) -> None:
    ns, release = unique("kf-typo"), unique("k0s-fleet")
    await create_namespace(mgmt, ns)
    out = await helm_cli("install", release, CONTROLLER_CHART, "--namespace", ns,
                         "--set", "replicaCont=3", "--kubeconfig", mgmt_kubeconfig,
                         check=False)
    assert "additional properties 'replicaCont' not allowed" in out
    assert await mgmt.get_or_none(DEPLOYMENTS, release, ns) is None
    assert await mgmt.get_or_none(CLUSTER_ROLES, release) is None
    listed = await helm_cli("list", "--namespace", ns, "-q", "--deployed", "--failed",
                            "--pending",
                            "--kubeconfig", mgmt_kubeconfig)
    assert listed.strip() == ""


# -- agent chart -----------------------------------------------------------------------
async def test_agent_chart_install_and_uninstall(wl1: KubeClient, wl1_kubeconfig: Path) -> None:
    ns, release = unique("kfa-sys"), unique("k0s-fleet-agent")
    await create_namespace(wl1, ns, pod_security="privileged")
    out = await helm_cli("install", release, AGENT_CHART, "--namespace", ns,
                         "--kubeconfig", wl1_kubeconfig)
    assert "STATUS: deployed" in out and "pod-security.kubernetes.io/enforce=privileged" in out
    # The API server announces ValidatingAdmissionPolicy, so the own-node policy is there.
    manifest = render(AGENT_CHART, release=release, namespace=ns)
    stored = {o["kind"]: o for o in await installed(wl1, manifest)}
    assert set(stored) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
                           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    ds = stored["DaemonSet"]
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    # The policy compiled: the API server reports no type-checking warnings for it.
    vap = await wl1.get(VAPS, f"{release}-own-node")
    assert not (vap.get("status") or {}).get("typeChecking", {}).get("expressionWarnings")
    await helm_cli("uninstall", release, "--namespace", ns, "--kubeconfig", wl1_kubeconfig)
    assert await gone(wl1, manifest) == []


# -- Pod Security admission of the pods the charts would run ------------------------------
def _pod_from(manifest: Manifest, name: str, node: str | None = None) -> dict[str, Any]:
    w = manifest.workload()
    spec = dict(pod_spec(w))
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": w["spec"]["template"]["metadata"]["labels"]},
            "spec": spec}


@pytest.fixture
async def psa_namespaces(wl2: KubeClient) -> AsyncIterator[dict[str, str]]:
    names = {level: unique(f"psa-{level}") for level in ("restricted", "baseline",
                                                         "privileged")}
    for level, name in names.items():
        await create_namespace(wl2, name, pod_security=level)
    yield names


async def test_controller_pod_is_admitted_under_restricted_pod_security(
        wl2: KubeClient, psa_namespaces: dict[str, str]) -> None:
    for values in [None, *sorted((CONTROLLER_CHART / "ci").glob("*-values.yaml"))]:
        m = render(CONTROLLER_CHART, *([values] if values else []))
        ns = psa_namespaces["restricted"]
        pod = await wl2.create(PODS, _pod_from(m, unique("ctl")), ns)
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


async def test_agent_pod_needs_the_privileged_level(
        wl2: KubeClient, psa_namespaces: dict[str, str]) -> None:
    node = unique("psa-node")
    await wl2.create(NODES, {"metadata": {"name": node}})
    for values in [None, AGENT_CHART / "ci" / "systemd-values.yaml"]:
        m = render(AGENT_CHART, *([values] if values else []))
        for level in ("restricted", "baseline"):
            with pytest.raises(ForbiddenError) as refused:
                await wl2.create(PODS, _pod_from(m, unique("agent"), node),
                                 psa_namespaces[level])
            msg = str(refused.value)
            assert "violates PodSecurity" in msg and "host namespaces" in msg
            assert "hostPath" in msg, msg
        admitted = await wl2.create(PODS, _pod_from(m, unique("agent"), node),
                                    psa_namespaces["privileged"])
        assert admitted["spec"]["hostPID"] is True


async def test_secret_read_is_cluster_wide_only_by_an_explicit_value(
        crds_installed: World, mgmt: KubeClient, mgmt_kubeconfig: Path) -> None:
    """Issue #29: with namespaces and rbac.secrets.clusterWide=false the controller's
    identity reads Secrets there and nowhere else; without namespaces that value refuses
    the install (the controller would watch Secrets in every namespace) and creates
    nothing."""
    ns, release, capi_ns = unique("kf-sec"), unique("k0s-fleet"), unique("capi")
    await create_namespace(mgmt, capi_ns)
    try:
        out = await helm_cli("install", release, CONTROLLER_CHART, "--namespace", ns,
                             "--create-namespace",
                             "--set", f"fleet.clusters.namespaces[0]={capi_ns}",
                             "--set", "rbac.secrets.clusterWide=false",
                             "--kubeconfig", mgmt_kubeconfig)
        assert "STATUS: deployed" in out
        token = await service_account_token(mgmt, ns, release)
        async with await crds_installed["mgmt"].client(token=token) as ctl:
            with anyio.fail_after(30):  # the authorizer's cache learns the new binding
                while True:
                    try:
                        await ctl.list(SECRETS, capi_ns)
                        break
                    except ForbiddenError:
                        await anyio.sleep(0.2)
            with pytest.raises(ForbiddenError):
                await ctl.list(SECRETS)
            with pytest.raises(ForbiddenError):
                await ctl.list(SECRETS, ns)
    finally:
        await helm_cli("uninstall", release, "--namespace", ns, "--kubeconfig",
                       mgmt_kubeconfig)
    other = unique("k0s-fleet")
    # the default (no namespaces, nothing asked for): refused before anything is created
    out = await helm_cli("install", other, CONTROLLER_CHART, "--namespace", ns,
                         "--kubeconfig", mgmt_kubeconfig, check=False)
    assert "rbac.secrets.clusterWide is false (the default)" in out
    assert "STATUS: deployed" not in out
    assert await mgmt.get_or_none(CLUSTER_ROLE_BINDINGS, other) is None
    assert await mgmt.get_or_none(CLUSTER_ROLES, other) is None
