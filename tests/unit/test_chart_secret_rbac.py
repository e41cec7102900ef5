"""Which Secrets the controller chart lets the controller read (issue #29 finding 1).

With namespaces known (rbac.namespaces, or fleet.clusters.namespaces and entries) the
Secret read is bound in those namespaces only. Without them the controller works in all
namespaces and watches kubeconfig Secrets cluster-wide: that grant exists only while
``rbac.secrets.clusterWide`` is true; false makes such an install fail, naming the value.
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


def test_cluster_wide_secret_read_only_while_the_value_allows_it() -> None:
    # the default keeps a fleet without namespaces working (it watches every namespace)
    assert _secret_bindings([]) == ([], ["r1-k0s-fleet"])
    assert _secret_bindings(["rbac.secrets.clusterWide=true"]) == ([], ["r1-k0s-fleet"])
    out = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["rbac.secrets.clusterWide=false"]), check=False)
    assert out.returncode != 0
    assert "rbac.secrets.clusterWide=false" in out.stderr
    assert "fleet.clusters.namespaces" in out.stderr
    typo = helm("template", "r1", *template_args(
        CONTROLLER_CHART, sets=["rbac.secrets.clusterwide=false"]), check=False)
    assert typo.returncode != 0 and "clusterwide" in typo.stderr
