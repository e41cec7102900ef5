"""The controller chart's PrometheusRule (metrics.prometheusRule), rendered by the real helm.

Each alert must name only metrics the controller exports (collected from the registry
``fleet.status.metrics.FleetMetrics`` fills, sample names included: ``_total``,
``_bucket``...), carry a summary and a runbook_url pointing at a section of
docs/operations.md that exists, and be listed in that document's "Alerts" section.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleet.status.metrics import FleetMetrics
from fleet.testing.binaries import REPO_ROOT
from tests.helpers.charts import CONTROLLER_CHART, OPTIONAL_APIS, render

OPERATIONS = REPO_ROOT / "docs" / "operations.md"
ENABLED = ("metrics.prometheusRule.enabled=true",)
METRIC = re.compile(r"\b(k0s_fleet_[a-zA-Z0-9_]*)")
# PromQL words that are not metric names, in the expressions the chart uses.
PROMQL_WORDS = {"max", "sum", "by", "increase", "absent", "namespace", "state", "phase",
                "reason", "cluster", "and", "or", "unless", "rate", "min", "count"}


def exported_metric_names() -> set[str]:
    """Every series name the controller's /metrics can serve (families and samples)."""
    registry = CollectorRegistry()
    FleetMetrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        suffixes = {"counter": ("_total", "_created"),
                    "histogram": ("_bucket", "_count", "_sum", "_created")}
        names.update(family.name + s for s in suffixes.get(family.type, ()))
    return names


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def rules(namespace: str = "fleet-system") -> list[dict[str, Any]]:
    manifest = render(CONTROLLER_CHART, sets=ENABLED, namespace=namespace)
    rule = manifest.one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == namespace
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def test_the_prometheus_rule_is_off_by_default_and_needs_the_api() -> None:
    assert not render(CONTROLLER_CHART).all("PrometheusRule")
    without = [a for a in OPTIONAL_APIS if a != "monitoring.coreos.com/v1"]
    assert not render(CONTROLLER_CHART, sets=ENABLED, api_versions=without).all(
        "PrometheusRule")
    assert render(CONTROLLER_CHART, sets=ENABLED).all("PrometheusRule")


def test_the_alerts_cover_the_operations_failures() -> None:
    names = {r["alert"] for r in rules()}
    assert {"K0sFleetNodeUpgradeFailed", "K0sFleetNodePlanPastDeadline",
            "K0sFleetRolloutHalted", "K0sFleetEmergencyStop", "K0sFleetClusterUnreachable",
            "K0sFleetNoActiveController"} <= names


def test_each_alert_names_only_metrics_the_controller_exports() -> None:
    exported = exported_metric_names()
    assert "k0s_fleet_node_upgrades_failed_total" in exported  # the collection works
    for r in rules():
        expr = r["expr"]
        used = set(METRIC.findall(expr))
        assert used, f"{r['alert']} names no k0s-fleet metric: {expr}"
        assert used <= exported, f"{r['alert']}: {sorted(used - exported)} not exported"
        # nothing else that could be a metric name (identifiers outside {...} and quotes)
        bare = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', " ", expr)
        words = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", bare)) - used
        assert words <= PROMQL_WORDS, f"{r['alert']}: unknown names {sorted(words - PROMQL_WORDS)}"
        # every metric selector is scoped to the release's namespace
        for sel in re.findall(r"k0s_fleet_[a-z_]+(\{[^}]*\})?", expr):
            assert 'namespace="fleet-system"' in sel, f"{r['alert']}: {expr}"


def test_each_alert_has_a_summary_and_a_runbook_in_operations_md() -> None:
    doc = OPERATIONS.read_text()
    known = anchors(doc)
    alerts_section = doc.split("\n## Alerts\n", 1)
    assert len(alerts_section) == 2, "docs/operations.md has no '## Alerts' section"
    section = alerts_section[1].split("\n## ", 1)[0]
    for r in rules():
        ann = r["annotations"]
        assert ann.get("summary"), r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical")
        url = ann["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/operations.md"), url
        assert anchor in known, f"{r['alert']}: no section #{anchor} in docs/operations.md"
        assert f"`{r['alert']}`" in section, f"{r['alert']} is not documented under Alerts"


@pytest.mark.parametrize("sets", [
    ("metrics.prometheusRule.clusterUnreachableFor=forever",),
    ("metrics.prometheusRule.colour=red",),
])
def test_prometheus_rule_values_are_checked(sets: tuple[str, ...]) -> None:
    with pytest.raises(AssertionError, match="values don't meet the specifications"):
        render(CONTROLLER_CHART, sets=(*ENABLED, *sets))
