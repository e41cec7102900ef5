"""Which Secrets the controller chart lets the controller read (issue #29 finding 1).

With namespaces known (rbac.namespaces, or fleet.clusters.namespaces and entries) the
Secret read is bound in those namespaces only. Without them the controller works in all
namespaces and watches kubeconfig Secrets cluster-wide: that grant exists only when
``rbac.secrets.clusterWide`` asks for it (default false: such an install fails, naming
the value).
The real API server checks the same in tests/integration/test_chart_install.py.
"""

from __future__ import annotations

from tests.helpers.charts import CONTROLLER_CHART, helm, render, template_args

SECRETS_READ = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch"]}


def _secret_bindings(sets: list[str]) -> tuple[list[str], list[str]]:
    """(namespaces of RoleBindings, names of ClusterRoleBindings) to a role reading
    Secrets."""
    m = render(CONTROLLER_CHART, sets=sets)
    reading = {r["metadata"]["name"] for r in m.all("ClusterRole")
               if SECRETS_READ in r["rules"]}
    namespaced = sorted(b["metadata"]["namespace"] for b in m.all("RoleBinding")
                        if b["roleRef"]["name"] in reading
                        and b["roleRef"]["kind"] == "ClusterRole")
    wide = sorted(b["metadata"]["name"] for b in m.all("ClusterRoleBinding")
                  if b["roleRef"]["name"] in reading)
    return namespaced, wide


def test_secrets_are_read_in_the_listed_namespaces_only() -> None:
    for extra in ([], ["rbac.secrets.clusterWide=false"], ["rbac.secrets.clusterWide=true"]):
        assert _secret_bindings(["fleet.clusters.namespaces[0]=capi-a",
                                 "fleet.clusters.namespaces[1]=capi-b", *extra]) == (
            ["capi-a", "capi-b"], [])
        assert _secret_bindings(["rbac.namespaces[0]=capi-c", *extra]) == (["capi-c"], [])


def test_cluster_wide_secret_read_only_when_asked_for() -> None:
    # the default asks for nothing: an install that names no namespace fails, naming both
    # ways out (helm called without the tests' scoped() values)
    default = helm("template", "r1", str(CONTROLLER_CHART), check=False)
    assert default.returncode != 0
    assert "rbac.secrets.clusterWide is false (the default)" in default.stderr
    assert "fleet.clusters.namespaces" in default.stderr
    assert _secret_bindings(["rbac.secrets.clusterWide=true"]) == ([], ["r1-k0s-fleet"])
    out = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["rbac.secrets.clusterWide=false"]), check=False)
    assert out.returncode != 0
    assert "rbac.secrets.clusterWide=true" in out.stderr
    typo = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["rbac.secrets.clusterwide=false"]), check=False)
    assert typo.returncode != 0 and "clusterwide" in typo.stderr
