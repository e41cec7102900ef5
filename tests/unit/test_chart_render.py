"""Both Helm charts rendered by the real, pinned ``helm``: lint, defaults, every
``ci/*-values.yaml``, schema refusals and the security properties the charts promise.

No API server is involved (``helm template`` renders offline); the integration tests in
``tests/integration/test_chart_install.py`` and ``test_rbac_*.py`` install the same charts.
The helpers here are shared with those tests.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.agents.settings import AgentSettings
from tests.helpers.charts import (
    AGENT_CHART,
    CONTROLLER_CHART,
    Manifest,
    helm,
    pod_spec,
    rbac_grants,
    render,
    template_args,
)

CHART_DIRS = (CONTROLLER_CHART, AGENT_CHART)

RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)














def ci_values(chart: Path) -> list[Path]:
    return sorted((chart / "ci").glob("*-values.yaml"))






# -- every chart, every values file ---------------------------------------------------
ALL_RENDERS = [
    pytest.param(chart, f, id=f"{chart.name}:{f.name if f else 'default'}")
    for chart in CHART_DIRS for f in [None, *ci_values(chart)]
]


@pytest.mark.parametrize(("chart", "values"), ALL_RENDERS)
def test_lint_strict(chart: Path, values: Path | None) -> None:
    extra = ["-f", str(values)] if values else []
    proc = helm("lint", "--strict", chart, *extra, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(("chart", "values"), ALL_RENDERS)
def test_objects_carry_recommended_labels(chart: Path, values: Path | None) -> None:
    m = render(chart, *([values] if values else []))
    for d in m.docs:
        labels = d["metadata"].get("labels", {})
        missing = [k for k in RECOMMENDED_LABELS if k not in labels]
        assert not missing, f"{d['kind']}/{d['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/part-of"] == "k0s-fleet"
    w = m.workload()
    selector = w["spec"]["selector"]["matchLabels"]
    pod_labels = w["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    # Selectors are immutable: they must not contain anything that changes per version.
    assert "app.kubernetes.io/version" not in selector and "helm.sh/chart" not in selector


@pytest.mark.parametrize(("chart", "values"), ALL_RENDERS)
def test_rbac_has_no_wildcards(chart: Path, values: Path | None) -> None:
    m = render(chart, *([values] if values else []))
    for kind in ("ClusterRole", "Role"):
        for role in m.all(kind):
            for rule in role["rules"]:
                for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: {rule}"
                assert "nonResourceURLs" not in rule


@pytest.mark.parametrize(("chart", "values"), ALL_RENDERS)
def test_workload_basics(chart: Path, values: Path | None) -> None:
    m = render(chart, *([values] if values else []))
    spec = pod_spec(m.workload())
    assert spec.get("hostNetwork") is not True and spec.get("hostIPC") is not True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        mounts = {v["mountPath"]: v["name"] for v in c["volumeMounts"]}
        assert mounts["/tmp"] == "tmp"
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    # An image reference that cannot float: explicit tag or digest.
    image = spec["containers"][0]["image"]
    assert "@sha256:" in image or (":" in image.rsplit("/", 1)[-1] and
                                   not image.endswith(":latest"))


@pytest.mark.parametrize("values", [None, *ci_values(CONTROLLER_CHART)],
                         ids=lambda v: v.name if v else "default")
def test_controller_pod_meets_restricted_pod_security(values: Path | None) -> None:
    spec = pod_spec(render(CONTROLLER_CHART, *([values] if values else [])).workload())
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert not {"hostPID", "hostNetwork", "hostIPC"} & {k for k, v in spec.items() if v is True}
    assert all("hostPath" not in v for v in spec["volumes"])
    (c,) = spec["containers"]
    assert c["securityContext"] == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True, "privileged": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


# -- controller chart -------------------------------------------------------------------
# The contract proven against a real API server (tests/integration/test_rbac_*.py).
CONTROLLER_RULES = {
    *{("cluster.x-k8s.io", "clusters", v, "*") for v in ("list", "watch")},
    *{("cluster.x-k8s.io", r, v, "*") for r in ("machinedeployments", "machinesets", "machines")
      for v in ("get", "list", "watch", "patch")},
    ("cluster.x-k8s.io", "machinedeployments/status", "patch", "*"),
    *{("cluster.x-k8s.io", "machinedrainrules", v, "*") for v in ("list", "watch")},
    *{("controlplane.cluster.x-k8s.io", "k0scontrolplanes", v, "*")
      for v in ("get", "list", "watch", "patch")},
    ("controlplane.cluster.x-k8s.io", "k0scontrolplanes/status", "patch", "*"),
    *{("controlplane.cluster.x-k8s.io", "k0smotroncontrolplanes", v, "*")
      for v in ("get", "list", "watch", "patch")},
    ("controlplane.cluster.x-k8s.io", "k0smotroncontrolplanes/status", "patch", "*"),
    *{("bootstrap.cluster.x-k8s.io", "k0sworkerconfigtemplates", v, "*")
      for v in ("get", "list", "watch", "patch")},
    *{("fleet.k0s-fleet.io", "nodeplans", v, "*")
      for v in ("get", "list", "watch", "create", "patch")},
    ("fleet.k0s-fleet.io", "nodeplans/status", "patch", "*"),
    ("", "secrets", "list", "*"),
    ("", "secrets", "watch", "*"),
    ("events.k8s.io", "events", "create", "*"),
}
DEFAULT_INFRA = {("infrastructure.cluster.x-k8s.io", r, "get", "*") for r in (
    "remotemachines", "pooledremotemachines", "dockermachines", "awsmachines",
    "azuremachines", "gcpmachines", "openstackmachines", "vspheremachines", "hcloudmachines",
    "proxmoxmachines", "metal3machines")}
LOCAL_RULES = {
    ("coordination.k8s.io", "leases", "create", "*"),
    ("coordination.k8s.io", "leases", "get", "k0s-fleet-controller"),
    ("coordination.k8s.io", "leases", "update", "k0s-fleet-controller"),
    ("", "configmaps", "create", "*"),
    *{("", "configmaps", v, "k0s-fleet-rollout") for v in ("get", "list", "watch", "patch")},
    ("events.k8s.io", "events", "create", "*"),
    ("fleet.k0s-fleet.io", "fleetupgrades", "get", "*"),
    ("fleet.k0s-fleet.io", "fleetupgrades", "list", "*"),
    ("fleet.k0s-fleet.io", "fleetupgrades", "watch", "*"),
    ("fleet.k0s-fleet.io", "fleetupgrades", "patch", "*"),
    ("fleet.k0s-fleet.io", "fleetupgrades/status", "patch", "*"),
}
SA_SUBJECT = [{"kind": "ServiceAccount", "name": "r1-k0s-fleet", "namespace": "fleet-system"}]


def test_controller_default_objects() -> None:
    m = render(CONTROLLER_CHART)
    assert m.kinds() == sorted([
        "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
        "Deployment", "FlowSchema", "PodDisruptionBudget", "PriorityLevelConfiguration",
        "Role", "RoleBinding", "Service", "ServiceAccount", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ])
    assert rbac_grants(m.one("ClusterRole", "r1-k0s-fleet")["rules"]) == (
        CONTROLLER_RULES | DEFAULT_INFRA)
    # No namespaces configured: the one cluster-wide grant, and NOTES says so.
    crb = m.one("ClusterRoleBinding", "r1-k0s-fleet")
    assert crb["roleRef"]["name"] == "r1-k0s-fleet" and crb["subjects"] == SA_SUBJECT
    role = m.one("Role", "r1-k0s-fleet")
    assert role["metadata"]["namespace"] == "fleet-system"
    assert rbac_grants(role["rules"]) == LOCAL_RULES
    assert m.one("RoleBinding", "r1-k0s-fleet-local")["subjects"] == SA_SUBJECT
    view = m.one("ClusterRole", "r1-k0s-fleet-nodeplans-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert rbac_grants(view["rules"]) == {("fleet.k0s-fleet.io", r, v, "*")
                                          for r in ("nodeplans", "fleetupgrades")
                                          for v in ("get", "list", "watch")}
    edit = m.one("ClusterRole", "r1-k0s-fleet-fleetupgrades-edit")
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert rbac_grants(edit["rules"]) == {("fleet.k0s-fleet.io", "fleetupgrades", v, "*")
                                          for v in ("create", "update", "patch", "delete")}
    sa = m.one("ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    spec = pod_spec(m.workload())
    assert spec["serviceAccountName"] == "r1-k0s-fleet"
    assert spec["automountServiceAccountToken"] is True
    assert m.workload()["spec"]["replicas"] == 2
    assert spec["affinity"]["podAntiAffinity"]
    args = spec["containers"][0]["args"]
    assert args == ["controller", "--log-level=INFO", "--write-qps=0", "--write-burst=50",
                    "--lease-seconds=15"]
    env = _env(spec)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # Lease identity


def test_api_priority_gives_the_controllers_lease_requests_a_level_of_their_own() -> None:
    m = render(CONTROLLER_CHART)
    fs = m.one("FlowSchema", "r1-k0s-fleet-leases")["spec"]
    plc = m.one("PriorityLevelConfiguration", "r1-k0s-fleet-leases")["spec"]
    assert fs["priorityLevelConfiguration"] == {"name": "r1-k0s-fleet-leases"}
    assert fs["matchingPrecedence"] < 9000  # ahead of the built-in service-accounts
    assert fs["rules"] == [{
        "subjects": [{"kind": "ServiceAccount", "serviceAccount": {
            "name": "r1-k0s-fleet", "namespace": "fleet-system"}}],
        "resourceRules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                           "verbs": ["get", "create", "update"],
                           "namespaces": ["fleet-system"]}]}]
    assert plc["type"] == "Limited"
    assert plc["limited"]["nominalConcurrencyShares"] == 10
    # The controller gets no rights on either: only whoever installs the chart needs them.
    for role in m.all("ClusterRole") + m.all("Role"):
        assert not any("flowcontrol.apiserver.k8s.io" in r.get("apiGroups", [])
                       for r in role["rules"])
    tuned = render(CONTROLLER_CHART, sets=["apiPriority.matchingPrecedence=500",
                                           "apiPriority.nominalConcurrencyShares=3",
                                           "apiPriority.queueLengthLimit=20",
                                           "serviceAccount.name=fleet-sa"])
    assert tuned.one("FlowSchema")["spec"]["matchingPrecedence"] == 500
    assert tuned.one("FlowSchema")["spec"]["rules"][0]["subjects"][0]["serviceAccount"][
        "name"] == "fleet-sa"
    limited = tuned.one("PriorityLevelConfiguration")["spec"]["limited"]
    assert limited["nominalConcurrencyShares"] == 3
    assert limited["limitResponse"]["queuing"]["queueLengthLimit"] == 20
    for off in (["apiPriority.enabled=false"],
                ["replicaCount=1", "leaderElection.enabled=false"]):  # no Leases at all
        plain = render(CONTROLLER_CHART, sets=off)
        assert not plain.all("FlowSchema") and not plain.all("PriorityLevelConfiguration")
    bad = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["apiPriority.matchingPrecedence=10000"]), check=False)
    assert bad.returncode != 0 and "matchingPrecedence" in bad.stderr


def test_write_rate_limit_values_become_controller_args() -> None:
    from fleet.cli.controller import DEFAULT_WRITE_BURST, SHARDED_WRITE_QPS  # noqa: PLC0415

    args = pod_spec(render(CONTROLLER_CHART).workload())["containers"][0]["args"]
    # the chart's defaults are the controller's own: no limit for the one active replica,
    assert "--write-qps=0" in args
    assert f"--write-burst={DEFAULT_WRITE_BURST}" in args
    # a limit where replicas share the API server
    sharded = render(CONTROLLER_CHART, sets=["sharding.enabled=true"])
    assert f"--write-qps={SHARDED_WRITE_QPS:g}" in pod_spec(
        sharded.workload())["containers"][0]["args"]
    tuned = render(CONTROLLER_CHART, sets=["json:writeRateLimit.qps=2.5",
                                           "writeRateLimit.burst=7"])
    args = pod_spec(tuned.workload())["containers"][0]["args"]
    assert "--write-qps=2.5" in args and "--write-burst=7" in args
    off = render(CONTROLLER_CHART, sets=["writeRateLimit.qps=0"])
    assert "--write-qps=0" in pod_spec(off.workload())["containers"][0]["args"]
    for bad_value in ("writeRateLimit.qps=-1", "writeRateLimit.burst=0"):
        bad = helm("template", "r1", *template_args(CONTROLLER_CHART, sets=[bad_value]),
                   check=False)
        assert bad.returncode != 0 and "writeRateLimit" in bad.stderr


def test_controller_works_only_in_the_listed_namespaces() -> None:
    m = render(CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "ha-values.yaml")
    bindings = {b["metadata"]["namespace"]: b for b in m.all("RoleBinding")
                if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                    "kind": "ClusterRole", "name": "r1-k0s-fleet"}}
    assert sorted(bindings) == ["capi-prod", "capi-staging"]
    assert all(b["subjects"] == SA_SUBJECT for b in bindings.values())
    assert m.all("ClusterRoleBinding") == []
    assert rbac_grants(m.one("ClusterRole", "r1-k0s-fleet")["rules"]) == CONTROLLER_RULES | {
        ("infrastructure.cluster.x-k8s.io", "remotemachines", "get", "*"),
        ("infrastructure.example.com", "bmmachines", "get", "*")}


def test_leader_election() -> None:
    m = render(CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "ha-values.yaml")
    args = pod_spec(m.workload())["containers"][0]["args"]
    assert "--lease-seconds=30" in args
    assert m.workload()["spec"]["replicas"] == 3
    assert m.one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    single = render(CONTROLLER_CHART, sets=["replicaCount=1", "leaderElection.enabled=false"])
    assert "--no-leader-elect" in pod_spec(single.workload())["containers"][0]["args"]
    assert rbac_grants(single.one("Role")["rules"]) == {
        g for g in LOCAL_RULES if g[1] != "leases"}
    assert not single.all("PodDisruptionBudget")


def test_sharding() -> None:
    m = render(CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "sharded-values.yaml")
    args = pod_spec(m.workload())["containers"][0]["args"]
    assert "--shards=64" in args and "--lease-seconds=15" in args
    assert m.workload()["spec"]["replicas"] == 4
    assert m.one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    # Member Leases are named after the Pods: get/list/watch/update on the namespace's
    # Leases (watched: a replica sees each renewal as it happens, for the hand-off time).
    assert rbac_grants(m.one("Role")["rules"]) == {
        g for g in LOCAL_RULES if g[1] != "leases"} | {
        ("coordination.k8s.io", "leases", verb, "*")
        for verb in ("create", "get", "list", "watch", "update")}
    plain = render(CONTROLLER_CHART)
    assert not any(a.startswith("--shards") for a in
                   pod_spec(plain.workload())["containers"][0]["args"])
    assert rbac_grants(plain.one("Role")["rules"]) == LOCAL_RULES
    proc = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["sharding.enabled=true", "leaderElection.enabled=false",
                                "replicaCount=1"]), check=False)
    assert proc.returncode != 0
    assert "sharding.enabled needs leaderElection.enabled=true" in proc.stderr
    bad = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["sharding.enabled=true", "sharding.shards=0"]), check=False)
    assert bad.returncode != 0 and "shards" in bad.stderr


def test_guard_policy_targets_the_controller_identity() -> None:
    m = render(CONTROLLER_CHART, namespace="k0s-fleet-system")
    vap = m.one("ValidatingAdmissionPolicy")
    (cond,) = vap["spec"]["matchConditions"]
    assert cond["expression"] == (
        'request.userInfo.username == "system:serviceaccount:k0s-fleet-system:r1-k0s-fleet"')
    rules = vap["spec"]["matchConstraints"]["resourceRules"]
    assert {r for rule in rules for r in rule["resources"]} == {
        "machines", "machinedeployments", "machinesets", "k0scontrolplanes",
        "k0smotroncontrolplanes", "k0sworkerconfigtemplates", "fleetupgrades"}
    assert all(rule["operations"] == ["UPDATE"] for rule in rules)
    binding = m.one("ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    assert not render(CONTROLLER_CHART, api_versions=[]).all("ValidatingAdmissionPolicy")
    assert not render(CONTROLLER_CHART, sets=["rbac.guard=false"]).all(
        "ValidatingAdmissionPolicy")


def test_more_than_one_replica_needs_leader_election() -> None:
    proc = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["replicaCount=2", "leaderElection.enabled=false"]), check=False)
    assert proc.returncode != 0
    assert "needs leaderElection.enabled=true" in proc.stderr
    single = render(CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "single-values.yaml")
    assert single.kinds() == ["ConfigMap", "Deployment", "Service"]
    spec = pod_spec(single.workload())
    assert spec["serviceAccountName"] == "k0s-fleet-preexisting"
    assert "--no-leader-elect" in spec["containers"][0]["args"]
    assert yaml.safe_load(single.one("ConfigMap")["data"]["fleet.yaml"])["rollout"] == {
        "paused": True}


FLEET_SAMPLE = {
    "clusters": {"namespaces": ["capi-a", "capi-b"]},
    "rollout": {"waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"env": "dev"}},
                           "canary": True}]},
    "download": {"digests": {"v1.31.3+k0s.0": {"amd64": "ab" * 32}}},
}


def test_fleet_values_become_the_mounted_config_and_roll_the_pods(tmp_path: Path) -> None:
    values = tmp_path / "fleet.yaml"
    values.write_text(yaml.safe_dump({"fleet": FLEET_SAMPLE}))
    m = render(CONTROLLER_CHART, values)
    cm = m.one("ConfigMap")
    assert yaml.safe_load(cm["data"]["fleet.yaml"]) == FLEET_SAMPLE
    spec = pod_spec(m.workload())
    (c,) = spec["containers"]
    env = _env(spec)
    assert env["K0S_FLEET_CONFIG"] == "/etc/k0s-fleet/fleet.yaml"
    assert env["K0S_FLEET_MANAGEMENT__NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["K0S_FLEET_STATUS__PORT"] == "8080"
    assert env["K0S_FLEET_EXTENSION__ENABLED"] == "false"
    # The controller works (and reads Secrets) only where the fleet looks for Clusters.
    work = [b for b in m.all("RoleBinding") if b["metadata"]["name"] == "r1-k0s-fleet-fleet"]
    assert sorted(b["metadata"]["namespace"] for b in work) == ["capi-a", "capi-b"]
    assert m.all("ClusterRoleBinding") == []
    assert {"name": "config", "mountPath": "/etc/k0s-fleet/fleet.yaml", "subPath": "fleet.yaml",
            "readOnly": True} in c["volumeMounts"]
    default = render(CONTROLLER_CHART)
    assert yaml.safe_load(default.one("ConfigMap")["data"]["fleet.yaml"]) == {}

    def checksum(x: Manifest) -> str:
        return str(x.workload()["spec"]["template"]["metadata"]["annotations"]
                   ["checksum/fleet-config"])

    assert checksum(m) != checksum(default)
    assert len(checksum(m)) == len(hashlib.sha256().hexdigest())


@pytest.mark.parametrize("fleet", [
    {"management": {"namespace": "elsewhere"}},
    {"status": {"port": 9090}},
    {"extension": {"enabled": True}},
    {"extension": {"certFile": "/x.pem"}},
])
def test_chart_owned_fleet_keys_are_refused(tmp_path: Path, fleet: dict[str, Any]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"fleet": fleet}))
    proc = helm("template", "r1", *template_args(CONTROLLER_CHART, values), check=False)
    assert proc.returncode != 0
    assert "are set by the chart" in proc.stderr
    # extension.mode is the fleet's own business
    values.write_text(yaml.safe_dump({"fleet": {"extension": {"mode": "never"}}}))
    helm("template", "r1", *template_args(CONTROLLER_CHART, values))


def test_service_monitor_only_when_enabled_and_the_api_exists() -> None:
    on = ["metrics.serviceMonitor.enabled=true"]
    assert render(CONTROLLER_CHART, sets=on).all("ServiceMonitor")
    assert not render(CONTROLLER_CHART, sets=on, api_versions=[]).all("ServiceMonitor")
    assert not render(CONTROLLER_CHART).all("ServiceMonitor")
    sm = render(CONTROLLER_CHART, sets=on).one("ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    svc = render(CONTROLLER_CHART).one("Service")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics",
                                     "protocol": "TCP"}]


def test_extension_with_cert_manager() -> None:
    m = render(CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "extension-certmanager-values.yaml")
    assert rbac_grants(m.one("ClusterRole", "r1-k0s-fleet")["rules"]) - (
        CONTROLLER_RULES | DEFAULT_INFRA) == {("cluster.x-k8s.io", "clusters", "get", "*")}
    assert rbac_grants(m.one("ClusterRole", "r1-k0s-fleet-extension")["rules"]) == {
        ("runtime.cluster.x-k8s.io", "extensionconfigs", v, "*") for v in ("get", "list", "watch")}
    assert m.one("ClusterRoleBinding", "r1-k0s-fleet-extension")["subjects"] == SA_SUBJECT
    svc = m.one("Service", "r1-k0s-fleet-extension")
    assert svc["spec"]["ports"][0]["targetPort"] == "extension"
    cert = m.one("Certificate")
    assert "r1-k0s-fleet-extension.fleet-system.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer",
                                         "name": "r1-k0s-fleet-extension-selfsigned"}
    assert m.one("Issuer")["spec"] == {"selfSigned": {}}
    ext = m.one("ExtensionConfig")
    assert "namespace" not in ext["metadata"]
    assert ext["metadata"]["annotations"]["runtime.cluster.x-k8s.io/inject-ca-from-secret"] == (
        f"fleet-system/{cert['spec']['secretName']}")
    assert ext["spec"]["clientConfig"]["service"] == {
        "name": "r1-k0s-fleet-extension", "namespace": "fleet-system", "port": 443}
    assert ext["spec"]["namespaceSelector"] == {"matchLabels": {"k0s-fleet.io/in-place": "true"}}
    spec = pod_spec(m.workload())
    assert {"name": "tls", "secret": {"secretName": cert["spec"]["secretName"]}} in spec["volumes"]
    ports = {p["name"]: p["containerPort"] for p in spec["containers"][0]["ports"]}
    assert ports["extension"] == 9443
    env = _env(spec)
    assert env["K0S_FLEET_EXTENSION__ENABLED"] == "true"
    assert env["K0S_FLEET_EXTENSION__PORT"] == "9443"
    mount = next(v for v in spec["containers"][0]["volumeMounts"] if v["name"] == "tls")
    assert env["K0S_FLEET_EXTENSION__CERT_FILE"] == mount["mountPath"] + "/tls.crt"
    assert env["K0S_FLEET_EXTENSION__KEY_FILE"] == mount["mountPath"] + "/tls.key"
    # Without cert-manager the chart says so instead of failing on an unknown kind.
    proc = helm("template", "r1", *template_args(
        CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "extension-certmanager-values.yaml",
        api_versions=["runtime.cluster.x-k8s.io/v1beta2"]), check=False)
    assert proc.returncode != 0 and "needs cert-manager" in proc.stderr


def test_extension_config_name_has_no_dots() -> None:
    m = render(CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "extension-secret-values.yaml",
               release="fleet.prod")
    assert m.one("ExtensionConfig")["metadata"]["name"] == "fleet-prod-k0s-fleet"


def test_extension_with_own_secret() -> None:
    m = render(CONTROLLER_CHART, CONTROLLER_CHART / "ci" / "extension-secret-values.yaml")
    assert not m.all("Certificate") and not m.all("Issuer")
    ext = m.one("ExtensionConfig")
    assert ext["spec"]["clientConfig"]["caBundle"].startswith("LS0t")
    assert "annotations" not in ext["metadata"]
    spec = pod_spec(m.workload())
    assert {"name": "tls", "secret": {"secretName": "k0s-fleet-extension-tls"}} in spec["volumes"]
    proc = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["extension.enabled=true", "extension.tls.mode=secret"]),
        check=False)
    assert proc.returncode != 0 and "existingSecret is required" in proc.stderr


def test_extension_network_policy_admits_only_cluster_api() -> None:
    """On by default with the extension: the controller pods' extension port admits only
    pods of Cluster API's controller namespace (a value); the metrics/health port stays
    open to all; the selector is a value; it can be switched off."""
    secret = CONTROLLER_CHART / "ci" / "extension-secret-values.yaml"
    m = render(CONTROLLER_CHART, secret)
    policy = m.one("NetworkPolicy", "r1-k0s-fleet-extension")
    assert policy["metadata"]["namespace"] == "fleet-system"
    deploy = m.workload()
    assert policy["spec"]["podSelector"] == deploy["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "capi-system"}}}],
         "ports": [{"port": "extension", "protocol": "TCP"}]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    ports = {p["name"] for p in pod_spec(deploy)["containers"][0]["ports"]}
    assert ports == {"extension", "metrics"}  # every port of the pod is named in a rule
    chosen = render(CONTROLLER_CHART, secret, sets=[
        "extension.networkPolicy.namespaceSelector.matchLabels.team=capi",
        "extension.networkPolicy.podSelector.matchLabels.cluster\\.x-k8s\\.io/provider"
        "=cluster-api"]).one("NetworkPolicy")
    assert chosen["spec"]["ingress"][0]["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "capi-system",
                                              "team": "capi"}},
        "podSelector": {"matchLabels": {"cluster.x-k8s.io/provider": "cluster-api"}}}]
    assert not render(CONTROLLER_CHART, secret,
                      sets=["extension.networkPolicy.enabled=false"]).all("NetworkPolicy")
    assert not render(CONTROLLER_CHART).all("NetworkPolicy")  # no extension, no policy


def test_crd_ships_with_the_controller_chart() -> None:
    out = helm("template", "r1", "--include-crds", *template_args(CONTROLLER_CHART))
    crds = [d for d in yaml.safe_load_all(out.stdout)
            if d and d["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "fleetupgrades.fleet.k0s-fleet.io", "nodeplans.fleet.k0s-fleet.io"]


# -- agent chart --------------------------------------------------------------------------
AGENT_RULES = {
    *{("", "nodes", v, "*") for v in ("get", "list", "watch", "patch")},
    ("", "pods", "list", "*"),
    ("", "pods/eviction", "create", "*"),
    ("", "namespaces", "list", "*"),
}


def _host_paths(spec: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    """volume name -> (host path, container path, read-only)."""
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    return {v["name"]: (v["hostPath"]["path"], mounts[v["name"]]["mountPath"],
                        bool(mounts[v["name"]].get("readOnly")))
            for v in spec["volumes"] if "hostPath" in v}


def _env(spec: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in spec["containers"][0]["env"]}


def test_agent_default_signal_strategy_has_no_capabilities() -> None:
    m = render(AGENT_CHART)
    assert m.kinds() == sorted(["ClusterRole", "ClusterRoleBinding", "DaemonSet",
                                "ServiceAccount", *["ValidatingAdmissionPolicy",
                                                    "ValidatingAdmissionPolicyBinding"] * 2])
    spec = pod_spec(m.workload())
    assert spec["hostPID"] is True
    assert spec["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    sc = spec["containers"][0]["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert _host_paths(spec) == {
        "k0s-bin": ("/usr/local/bin", "/host/usr/local/bin", False),
        "k0s-run": ("/run/k0s", "/host/run/k0s", True),
        "state": ("/var/lib/k0s-fleet-agent", "/host/var/lib/k0s-fleet-agent", False),
    }
    env = _env(spec)
    assert env["K0S_FLEET_AGENT_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["K0S_FLEET_AGENT_K0S_BINARY"] == "/host/usr/local/bin/k0s"
    assert env["K0S_FLEET_AGENT_RESTART_STRATEGY"] == "signal"
    assert rbac_grants(m.one("ClusterRole")["rules"]) == AGENT_RULES


@pytest.mark.parametrize("values", ["systemd-values.yaml", "controller-role-values.yaml"])
def test_agent_privileged_only_for_nsenter_strategies(values: str) -> None:
    spec = pod_spec(render(AGENT_CHART, AGENT_CHART / "ci" / values).workload())
    sc = spec["containers"][0]["securityContext"]
    assert sc["privileged"] is True
    assert "appArmorProfile" not in spec["securityContext"]
    assert _env(spec)["K0S_FLEET_AGENT_HOST_NAMESPACE"] == "always"


def test_agent_custom_paths_and_controller_nodes() -> None:
    spec = pod_spec(render(AGENT_CHART, AGENT_CHART / "ci" / "custom-paths-values.yaml")
                    .workload())
    assert _host_paths(spec)["k0s-bin"] == ("/opt/bin", "/host/opt/bin", False)
    assert _host_paths(spec)["k0s-run"] == ("/var/run/k0s", "/host/var/run/k0s", True)
    assert _env(spec)["K0S_FLEET_AGENT_STATUS_SOCKET"] == "/host/var/run/k0s/status.sock"
    m = render(AGENT_CHART, AGENT_CHART / "ci" / "controller-role-values.yaml")
    assert rbac_grants(m.one("ClusterRole")["rules"]) == AGENT_RULES
    assert pod_spec(m.workload())["nodeSelector"] == {
        "node-role.kubernetes.io/control-plane": "true"}
    assert "affinity" not in pod_spec(m.workload())


@pytest.mark.parametrize("values", [None, *ci_values(AGENT_CHART)],
                         ids=lambda v: v.name if v else "default")
def test_agent_never_reads_secrets_or_touches_other_kinds(values: Path | None) -> None:
    m = render(AGENT_CHART, *([values] if values else []))
    grants = rbac_grants(r for role in m.all("ClusterRole") for r in role["rules"])
    assert grants == AGENT_RULES
    assert not m.all("Role")


@pytest.mark.parametrize("values", [None, *ci_values(AGENT_CHART)],
                         ids=lambda v: v.name if v else "default")
def test_agent_env_is_valid_agent_settings(values: Path | None) -> None:
    """Every K0S_FLEET_AGENT_* the chart sets is a real agent setting with a valid value."""
    env = _env(pod_spec(render(AGENT_CHART, *([values] if values else [])).workload()))
    fields = {k.removeprefix("K0S_FLEET_AGENT_").lower(): v for k, v in env.items()}
    unknown = set(fields) - set(AgentSettings.model_fields)
    assert not unknown, f"chart sets unknown agent settings {unknown}"
    fields["node_name"] = "node-a"
    AgentSettings.model_validate({k: v for k, v in fields.items() if isinstance(v, str)})


def test_own_node_policy_targets_the_agent_identity() -> None:
    m = render(AGENT_CHART, namespace="k0s-fleet-agent")
    vap = m.one("ValidatingAdmissionPolicy", "r1-k0s-fleet-agent-own-node")
    (cond,) = vap["spec"]["matchConditions"]
    assert cond["expression"] == (
        'request.userInfo.username == "system:serviceaccount:k0s-fleet-agent:r1-k0s-fleet-agent"')
    binding = m.one("ValidatingAdmissionPolicyBinding", "r1-k0s-fleet-agent-own-node")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    assert not render(AGENT_CHART, api_versions=[]).all("ValidatingAdmissionPolicy")
    assert [v["metadata"]["name"] for v in render(
        AGENT_CHART, sets=["rbac.ownNodeOnly=false"]).all("ValidatingAdmissionPolicy")] == [
        "r1-k0s-fleet-agent-signal-request"]


def test_signal_policy_exempts_exactly_the_configured_controller_identity() -> None:
    m = render(AGENT_CHART, sets=["signalPolicy.controllerUsers[0]=capi-admin",
                                  "json:signalPolicy.controllerGroups=[]"])
    vap = m.one("ValidatingAdmissionPolicy", "r1-k0s-fleet-agent-signal-request")
    (cond,) = vap["spec"]["matchConditions"]
    assert '["capi-admin"]' in cond["expression"] and "[]" in cond["expression"]
    default = render(AGENT_CHART).one("ValidatingAdmissionPolicy",
                                      "r1-k0s-fleet-agent-signal-request")
    assert '["system:masters"]' in default["spec"]["matchConditions"][0]["expression"]
    assert [v["metadata"]["name"] for v in render(
        AGENT_CHART, sets=["signalPolicy.enabled=false"]).all("ValidatingAdmissionPolicy")] == [
        "r1-k0s-fleet-agent-own-node"]


def test_agent_allowed_url_prefixes_reach_the_agent() -> None:
    env = _env(pod_spec(render(AGENT_CHART, sets=[
        "download.allowedUrlPrefixes[0]=https://mirror.example/k0s/"]).workload()))
    assert env["K0S_FLEET_AGENT_ALLOWED_URL_PREFIXES"] == '["https://mirror.example/k0s/"]'
    default = _env(pod_spec(render(AGENT_CHART).workload()))
    assert json.loads(default["K0S_FLEET_AGENT_ALLOWED_URL_PREFIXES"]) == list(
        AgentSettings.model_fields["allowed_url_prefixes"].default)


# -- schema: a typo fails at install, not at 3 a.m. ----------------------------------------
BAD_VALUES = [
    (CONTROLLER_CHART, "replicaCont=2", "additional properties 'replicaCont'"),
    (CONTROLLER_CHART, "leaderElection.leaseDurationSecond=3", "'leaseDurationSecond'"),
    (CONTROLLER_CHART, "json:replicaCount=\"two\"", "/replicaCount"),
    (CONTROLLER_CHART, "metrics.port=70000", "/metrics/port"),
    (CONTROLLER_CHART, "extension.tls.mode=vault", "/extension/tls/mode"),
    (CONTROLLER_CHART, "image.digest=latest", "/image/digest"),
    (CONTROLLER_CHART, "rbac.namespaces[0]=Not_A_Namespace", "/rbac/namespaces/0"),
    (CONTROLLER_CHART, "json:rbac.infrastructureMachines=[{\"group\":\"x.io\"}]", "'group'"),
    (CONTROLLER_CHART, "leaderElection.leaseName=x", "'leaseName'"),
    (CONTROLLER_CHART, "json:resources={\"request\":{\"cpu\":\"1\"}}", "'request'"),
    (CONTROLLER_CHART, "json:tolerations=[{\"operatr\":\"Exists\"}]", "'operatr'"),
    (AGENT_CHART, "restart.strategy=reboot", "/restart/strategy"),
    (AGENT_CHART, "k0s.binary=relative/k0s", "/k0s/binary"),
    (AGENT_CHART, "json:drain.timeoutSeconds=\"5m\"", "/drain/timeoutSeconds"),
    (AGENT_CHART, "hostNetwork=true", "additional properties 'hostNetwork'"),
    (AGENT_CHART, "rbac.secrets=true", "'secrets'"),
]


@pytest.mark.parametrize(("chart", "setting", "message"), BAD_VALUES,
                         ids=[f"{c.name}:{s}" for c, s, _ in BAD_VALUES])
def test_schema_refuses_bad_values(chart: Path, setting: str, message: str) -> None:
    proc = helm("template", "r1", *template_args(chart, sets=[setting]), check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert "don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda c: c.name)
def test_schema_forbids_unknown_keys_everywhere(chart: Path) -> None:
    """Every object schema that lists properties closes itself (additionalProperties)."""
    schema = json.loads((chart / "values.schema.json").read_text())
    open_objects: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node and node.get("additionalProperties") is not False:
                open_objects.append(where)
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(schema, "")
    assert not open_objects
    # and every default value passes it (helm lint checks that too)
    assert set(yaml.safe_load((chart / "values.yaml").read_text())) <= set(schema["properties"])


def test_version_guard_is_opt_in() -> None:
    names = {p["metadata"]["name"] for p in render(CONTROLLER_CHART).all(
        "ValidatingAdmissionPolicy")}
    assert names == {"r1-k0s-fleet-guard"}
    m = render(CONTROLLER_CHART, sets=["rbac.versionGuard=true"], namespace="k0s-fleet-system")
    vap = next(p for p in m.all("ValidatingAdmissionPolicy")
               if p["metadata"]["name"] == "r1-k0s-fleet-version-guard")
    conds = {c["name"]: c["expression"] for c in vap["spec"]["matchConditions"]}
    assert conds["not-the-k0s-fleet-controller"] == (
        'request.userInfo.username != "system:serviceaccount:k0s-fleet-system:r1-k0s-fleet"')
    assert {r for rule in vap["spec"]["matchConstraints"]["resourceRules"]
            for r in rule["resources"]} == {"machinedeployments", "k0scontrolplanes",
                                            "k0sworkerconfigtemplates"}
    assert not render(CONTROLLER_CHART, sets=["rbac.versionGuard=true"], api_versions=[]).all(
        "ValidatingAdmissionPolicy")
