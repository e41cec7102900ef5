"""``promtool test rules`` for every alert of the controller chart's PrometheusRule.

The rule is rendered by the real helm, its groups written as a Prometheus rule file, and
each alert gets a promtool test file of its own (in ``tmp_path``, kept on failure) with
series under which it must fire (labels and rendered annotations exactly) and series or
moments at which it must stay silent: before its ``for``, for another namespace, for a
healthy value. promtool is built from the pinned Prometheus Go module by
hack/testenv/build.sh (``make testenv``). An alert of the chart without scenarios here
fails the test, and so does a scenario for an alert the chart no longer has.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.testing.binaries import binary
from tests.helpers.charts import CONTROLLER_CHART, render

NS = "fleet-system"
ENABLED = ("metrics.prometheusRule.enabled=true",)


def rule_groups(*sets: str) -> list[dict[str, Any]]:
    """The PrometheusRule's groups as the chart renders them for namespace ``NS``."""
    rule = render(CONTROLLER_CHART, sets=(*ENABLED, *sets), namespace=NS).one("PrometheusRule")
    return rule["spec"]["groups"]  # type: ignore[no-any-return]


def alert_rules(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in {"namespace": NS, **labels}.items())
    return {"series": f"{metric}{{{body}}}", "values": values}


@dataclass
class Case:
    """One promtool test: the input series, then (eval_time, expected alert labels or
    None for silence, the value ``$value`` stands for in the annotations)."""

    input_series: list[dict[str, str]]
    fires: list[tuple[str, dict[str, str], str]] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)


PHASE = "k0s_fleet_rollout_phase"
# Per alert: cases where it fires (eval time, labels beyond severity/alertname, $value)
# and where it must not. Evaluation every minute; "0x4 2x20" is 0 at 0m..4m, then 2 from
# 5m (aXn expands to n+1 samples); a range [30m] at t holds the samples in (t-30m, t].
SCENARIOS: dict[str, list[Case]] = {
    "K0sFleetNodeUpgradeFailed": [
        # 2 failed nodes from 5m on: pending for 5m, firing from 10m
        Case([series("k0s_fleet_nodes", "0x4 2x20", state="Failed"),
              series("k0s_fleet_nodes", "3x25", state="Upgrading")],
             fires=[("10m", {"namespace": NS}, "2"), ("20m", {"namespace": NS}, "2")],
             silent=["4m", "9m"]),
        # failures retried away before the 5m are over; another release's failures
        Case([series("k0s_fleet_nodes", "1x3 0x20", state="Failed"),
              series("k0s_fleet_nodes", "1x25", state="Failed", namespace="other")],
             silent=["3m", "10m", "20m"]),
    ],
    "K0sFleetNodePlanPastDeadline": [
        # one NodePlan failed on its deadline at 11m: firing while the 30m window holds the
        # step (10m -> 11m), i.e. 11m..40m exclusive
        Case([series("k0s_fleet_node_upgrades_failed_total", "0x10 1x50", reason="deadline"),
              series("k0s_fleet_node_upgrades_failed_total", "0x60", reason="node")],
             fires=[("12m", {"namespace": NS}, "1"), ("39m", {"namespace": NS}, "1")],
             silent=["10m", "41m"]),
        # failures of other reasons, or in another namespace, are not deadlines here
        Case([series("k0s_fleet_node_upgrades_failed_total", "0 1 2 3 4 5 6 7 8 9",
                     reason="node"),
              series("k0s_fleet_node_upgrades_failed_total", "0 1 2 3 4 5 6 7 8 9",
                     reason="deadline", namespace="other")],
             silent=["5m", "9m"]),
    ],
    "K0sFleetRolloutHalted": [
        Case([series(PHASE, "0x2 1x20", phase="Halted"),
              series(PHASE, "1x2 0x20", phase="Progressing")],
             fires=[("8m", {"namespace": NS}, "1"), ("20m", {"namespace": NS}, "1")],
             silent=["2m", "7m"]),
        # halted for less than 5m, then progressing again
        Case([series(PHASE, "1x3 0x20", phase="Halted"),
              series(PHASE, "0x3 1x20", phase="Progressing"),
              series(PHASE, "1x20", phase="Halted", namespace="other")],
             silent=["3m", "8m", "15m"]),
    ],
    "K0sFleetClustersFailed": [
        Case([series("k0s_fleet_clusters", "0x5 3x30", phase="Failed")],
             fires=[("21m", {"namespace": NS}, "3")], silent=["5m", "20m"]),
        Case([series("k0s_fleet_clusters", "0x30", phase="Failed"),
              series("k0s_fleet_clusters", "4x30", phase="Upgrading")],
             silent=["20m", "30m"]),
    ],
    "K0sFleetEmergencyStop": [
        Case([series(PHASE, "0 1x10", phase="Stopped")],
             fires=[("2m", {"namespace": NS}, "1")], silent=["0m", "1m"]),
        Case([series(PHASE, "0x10", phase="Stopped"), series(PHASE, "1x10", phase="Paused")],
             silent=["5m", "10m"]),
    ],
    "K0sFleetClusterUnreachable": [
        # edge-01 unreachable from 2m (firing after the default 15m), edge-02 for 5m only
        Case([series("k0s_fleet_cluster_unreachable", "_ _ 1x30", cluster="fleet-prod/edge-01"),
              series("k0s_fleet_cluster_unreachable", "1x5", cluster="fleet-prod/edge-02")],
             fires=[("17m", {"namespace": NS, "cluster": "fleet-prod/edge-01"}, "1")],
             silent=["5m", "16m"]),
    ],
    "K0sFleetNoActiveController": [
        # only another release's controller publishes: ours is missing for 15m
        Case([series(PHASE, "1x30", phase="Progressing", namespace="other")],
             fires=[("15m", {"namespace": NS}, "1"), ("25m", {"namespace": NS}, "1")],
             silent=["0m", "14m"]),
        Case([series(PHASE, "1x30", phase="Complete")], silent=["15m", "30m"]),
    ],
}


def expand(text: str, labels: dict[str, str], value: str) -> str:
    """The annotation templates the chart uses: ``{{ $value }}``, ``{{ $labels.x }}``."""
    out = text.replace("{{ $value }}", value)
    for k, v in labels.items():
        out = out.replace(f"{{{{ $labels.{k} }}}}", v)
    assert "{{" not in out, f"unexpanded template in {text!r}"
    return out


def promtool_test(rule: dict[str, Any], cases: list[Case], rule_file: str) -> dict[str, Any]:
    tests = []
    for case in cases:
        checks: list[dict[str, Any]] = []
        for at in case.silent:
            checks.append({"eval_time": at, "alertname": rule["alert"], "exp_alerts": []})
        for at, labels, value in case.fires:
            all_labels = {**labels, **rule.get("labels", {})}
            checks.append({"eval_time": at, "alertname": rule["alert"], "exp_alerts": [{
                "exp_labels": all_labels,
                "exp_annotations": {k: expand(v, all_labels, value)
                                    for k, v in rule.get("annotations", {}).items()},
            }]})
        tests.append({"interval": "1m", "input_series": case.input_series,
                      "alert_rule_test": checks})
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}


def promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary("promtool")), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def groups() -> list[dict[str, Any]]:
    return rule_groups()


def test_every_alert_has_scenarios(groups: list[dict[str, Any]]) -> None:
    alerts = alert_rules(groups)
    assert sorted(alerts) == sorted(SCENARIOS)
    for name, cases in SCENARIOS.items():
        assert any(c.fires for c in cases), f"{name}: no case where it fires"
        assert any(c.silent for c in cases), f"{name}: no case where it stays silent"


def test_promtool_checks_the_rendered_rules(groups: list[dict[str, Any]],
                                            tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    proc = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules(groups))} rules found" in proc.stdout


@pytest.mark.parametrize("alert", sorted(SCENARIOS))
def test_promtool_unit_tests(alert: str, groups: list[dict[str, Any]], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    rule = alert_rules(groups)[alert]
    test_file = tmp_path / f"{alert}.test.yaml"
    test_file.write_text(yaml.safe_dump(promtool_test(rule, SCENARIOS[alert], "rules.yaml"),
                                        sort_keys=False))
    proc = promtool("test", "rules", test_file.name, cwd=tmp_path)
    assert proc.returncode == 0, f"{test_file}:\n{proc.stdout}{proc.stderr}"
    assert "SUCCESS" in proc.stdout


def test_a_wrong_expectation_fails(groups: list[dict[str, Any]], tmp_path: Path) -> None:
    """promtool must be able to fail these tests: the firing case expected silent."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    rule = alert_rules(groups)["K0sFleetRolloutHalted"]
    case = SCENARIOS["K0sFleetRolloutHalted"][0]
    wrong = Case(case.input_series, silent=[case.fires[0][0]])
    (tmp_path / "wrong.test.yaml").write_text(
        yaml.safe_dump(promtool_test(rule, [wrong], "rules.yaml")))
    proc = promtool("test", "rules", "wrong.test.yaml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "K0sFleetRolloutHalted" in proc.stdout + proc.stderr


def test_the_durations_follow_the_values(tmp_path: Path) -> None:
    """clusterUnreachableFor / noControllerFor move the alerts' ``for`` (and summaries)."""
    groups = rule_groups("metrics.prometheusRule.clusterUnreachableFor=3m",
                         "metrics.prometheusRule.noControllerFor=2m")
    rules = alert_rules(groups)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    cases = {
        "K0sFleetClusterUnreachable": [Case(
            [series("k0s_fleet_cluster_unreachable", "1x10", cluster="ns/c")],
            fires=[("3m", {"namespace": NS, "cluster": "ns/c"}, "1")], silent=["2m"])],
        "K0sFleetNoActiveController": [Case(
            [], fires=[("2m", {"namespace": NS}, "1")], silent=["1m"])],
    }
    for alert, alert_cases in cases.items():
        f = tmp_path / f"{alert}.test.yaml"
        f.write_text(yaml.safe_dump(promtool_test(rules[alert], alert_cases, "rules.yaml")))
        proc = promtool("test", "rules", f.name, cwd=tmp_path)
        assert proc.returncode == 0, f"{f}:\n{proc.stdout}{proc.stderr}"
