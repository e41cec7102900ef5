"""docs/operations.md's table of what the controller may do ("exactly these rules") is the
chart's RBAC: parsed from the document and compared with what the real helm renders from
charts/k0s-fleet/templates/rbac.yaml, in every combination of the values that change it.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import yaml

from fleet.testing.binaries import REPO_ROOT
from tests.helpers.charts import CONTROLLER_CHART, Manifest, render

OPERATIONS = REPO_ROOT / "docs" / "operations.md"
RELEASE = "r1"
NAMESPACE = "fleet-system"
FULLNAME = f"{RELEASE}-k0s-fleet"
FLAGS = ("leaderElection.enabled", "sharding.enabled", "extension.enabled")
SCOPES = ("Cluster namespaces", "cluster-wide", "own namespace")
INFRA = "each `rbac.infrastructureMachines[].apiGroup`"

Grant = tuple[str, str, str, str, str]  # scope, apiGroup, resource, verb, name or "*"


def table_rows() -> list[list[str]]:
    doc = OPERATIONS.read_text()
    header = "| where | API group | resources | verbs | only these names |"
    assert doc.count(header) == 1, "the controller's RBAC table is not in docs/operations.md"
    lines = doc.split(header, 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert rows
    return rows


def _words(cell: str) -> list[str]:
    return [w.strip().strip("`") for w in cell.split(",") if w.strip()]


def documented(flags: dict[str, bool]) -> set[Grant]:
    infra = yaml.safe_load((CONTROLLER_CHART / "values.yaml").read_text())["rbac"][
        "infrastructureMachines"]
    out: set[Grant] = set()
    for where, group, resources, verbs, names in table_rows():
        scope, *conditions = [c.strip() for c in where.split(",")]
        assert scope in SCOPES, f"unknown scope {scope!r} in the RBAC table"
        applies = True
        for cond in conditions:
            negated = cond.startswith("not ")
            flag = cond.removeprefix("not ").strip("`")
            assert flag in FLAGS, f"unknown condition {cond!r} in the RBAC table"
            applies &= flags[flag] != negated
        if not applies:
            continue
        if group == INFRA:
            pairs = [(e["apiGroup"], r) for e in infra for r in e["resources"]]
        else:
            g = "" if group == "core" else group.strip("`")
            pairs = [(g, r) for r in _words(resources)]
        for (g, r), v in itertools.product(pairs, _words(verbs)):
            for n in _words(names) or ["*"]:
                out.add((scope, g, r, v, n))
    return out


def _grants(scope: str, rules: list[dict[str, Any]]) -> set[Grant]:
    return {(scope, g, r, v, n) for rule in rules for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", [])
            for n in rule.get("resourceNames") or ["*"]}


def rendered(manifest: Manifest) -> set[Grant]:
    """Every rule bound to the controller's ServiceAccount, with the scope it is bound at."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in manifest.docs
             if d["kind"] in ("ClusterRole", "Role")}
    out: set[Grant] = set()
    bound = 0
    for b in manifest.docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == FULLNAME
                   and s.get("namespace") == NAMESPACE for s in b.get("subjects", [])):
            continue
        bound += 1
        ref = b["roleRef"]
        role = roles[(ref["kind"], ref["name"])]
        if ref["kind"] == "ClusterRole" and ref["name"] == FULLNAME:
            scope = "Cluster namespaces"
        elif ref["kind"] == "ClusterRole" and b["kind"] == "ClusterRoleBinding":
            scope = "cluster-wide"
        elif ref["kind"] == "Role" and b["metadata"].get("namespace") == NAMESPACE:
            scope = "own namespace"
        else:
            raise AssertionError(f"a binding the table has no scope for: {b['metadata']}")
        out |= _grants(scope, role["rules"])
    assert bound >= 2
    return out


COMBINATIONS = [dict(zip(FLAGS, bits, strict=True))
                for bits in itertools.product((False, True), repeat=len(FLAGS))
                if bits[0] or not bits[1]]  # sharding needs leader election


@pytest.mark.parametrize("flags", COMBINATIONS,
                         ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in COMBINATIONS])
def test_the_rbac_table_in_operations_md_is_what_the_chart_grants(
        flags: dict[str, bool]) -> None:
    sets = [f"{k}={str(v).lower()}" for k, v in flags.items()]
    if not flags["leaderElection.enabled"]:
        sets.append("replicaCount=1")
    manifest = render(CONTROLLER_CHART, sets=sets, release=RELEASE, namespace=NAMESPACE)
    doc, chart = documented(flags), rendered(manifest)
    missing = sorted(chart - doc)
    extra = sorted(doc - chart)
    assert not missing and not extra, (
        f"docs/operations.md's RBAC table differs from charts/k0s-fleet/templates/rbac.yaml "
        f"with {sets}:\n  granted by the chart, not in the table: {missing}\n"
        f"  in the table, not granted: {extra}")


def test_the_table_is_the_same_bound_per_namespace() -> None:
    """With namespaces known, the ClusterRole is bound there (one RoleBinding each), and
    the rules are the same."""
    flags = dict.fromkeys(FLAGS, False) | {"leaderElection.enabled": True}
    manifest = render(CONTROLLER_CHART, sets=["json:rbac.namespaces=[\"a\",\"b\"]"],
                      release=RELEASE, namespace=NAMESPACE)
    per_ns = [b for b in manifest.all("RoleBinding")
              if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": FULLNAME}]
    assert sorted(b["metadata"]["namespace"] for b in per_ns) == ["a", "b"]
    assert {g[1:] for g in rendered(manifest) if g[0] == "Cluster namespaces"} == {
        g[1:] for g in documented(flags) if g[0] == "Cluster namespaces"}


def test_the_parser_sees_a_changed_row() -> None:
    """The comparison can fail: a verb the table does not list is reported."""
    flags = dict.fromkeys(FLAGS, False) | {"leaderElection.enabled": True}
    doc = documented(flags)
    assert ("Cluster namespaces", "cluster.x-k8s.io", "machinesets", "patch", "*") in doc
    assert ("own namespace", "", "configmaps", "get", "k0s-fleet-rollout") in doc
    assert not re.search(r"\bdelete\b", " ".join(" ".join(r) for r in table_rows()))
