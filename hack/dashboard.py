"""Generates the controller chart's Grafana dashboard (charts/k0s-fleet/dashboards/k0s-fleet.json)
with Grafana's own builder library (grafana-foundation-sdk), over the metrics the controller
serves on /metrics (fleet/status/metrics.py, fleet/status/runtime.py).

    .venv/bin/python hack/dashboard.py           # write the JSON
    .venv/bin/python hack/dashboard.py --check   # exit 1 if the committed JSON differs

tests/unit/test_dashboard.py checks that the committed file is what this script writes and
that every metric a panel queries is one the controller exports. The chart ships it as a
ConfigMap for the Grafana sidecar (values grafanaDashboard.*, off by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    BigValueTextMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableOption,
    VariableRefresh,
)

OUT = Path(__file__).resolve().parents[1] / "charts" / "k0s-fleet" / "dashboards" / "k0s-fleet.json"
UID = "k0s-fleet-overview"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
# The release's namespace: the ServiceMonitor (or your scrape config) adds the label.
SEL = 'namespace="$namespace"'


def query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    return q.legend_format(legend) if legend else q


def series(title: str, description: str, unit: str,
           *queries: prometheus.Dataquery, height: int = 8,
           width: int = 12) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit)
             .datasource(DS).height(height).span(width).fill_opacity(10))
    for q in queries:
        panel = panel.with_target(q)
    return panel


def big(title: str, description: str, unit: str, q: prometheus.Dataquery,
        *, width: int = 6, text: BigValueTextMode = BigValueTextMode.AUTO) -> stat.Panel:
    return (stat.Panel().title(title).description(description).unit(unit).datasource(DS)
            .height(4).span(width).graph_mode(BigValueGraphMode.NONE)
            .color_mode(BigValueColorMode.VALUE).text_mode(text)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
            .with_target(q))


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    rate = "$__rate_interval"
    board = (
        dashboard.Dashboard("k0s-fleet")
        .uid(UID)
        .description("In-place k0s upgrades across the fleet: rollout, node upgrades, and "
                     "the controller process (k0s-fleet's /metrics).")
        .tags(["k0s-fleet", "k0s", "cluster-api"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                       .type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("namespace").label("Namespace")
            .datasource(DS)
            .query("label_values(k0s_fleet_build_info, namespace)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .current(VariableOption(text="k0s-fleet-system", value="k0s-fleet-system",
                                    selected=True)))
        # -- the rollout ----------------------------------------------------------------
        .with_row(dashboard.Row("Rollout"))
        .with_panel(big("Rollout phase", "The fleet rollout's phase (k0s_fleet_rollout_phase).",
                        "none", query(f"max by (phase) (k0s_fleet_rollout_phase{{{SEL}}}) == 1",
                                      "{{phase}}"), text=BigValueTextMode.NAME))
        .with_panel(big("Progress", "Share of the fleet's nodes on their target version and "
                        "Ready.", "percentunit",
                        query(f"max(k0s_fleet_rollout_progress_ratio{{{SEL}}})")))
        .with_panel(big("Failed nodes", "NodePlans in phase Failed: each counts against the "
                        "failure budget until retried.", "none",
                        query(f'max(k0s_fleet_nodes{{{SEL}, state="Failed"}})')))
        .with_panel(big("Unreachable clusters", "Workload clusters whose API server does not "
                        "answer: nothing new starts there.", "none",
                        query(f"max(k0s_fleet_clusters_unreachable{{{SEL}}})")))
        .with_panel(series("Nodes by state", "The fleet's nodes by upgrade state.", "none",
                           query(f"max by (state) (k0s_fleet_nodes{{{SEL}}})", "{{state}}")))
        .with_panel(series("Clusters by phase", "The fleet's clusters by rollout phase.",
                           "none",
                           query(f"max by (phase) (k0s_fleet_clusters{{{SEL}}})", "{{phase}}")))
        .with_panel(series("Wave progress", "Share of each wave's clusters that are complete.",
                           "percentunit",
                           query(f"max by (wave) (k0s_fleet_wave_progress_ratio{{{SEL}}})",
                                 "{{wave}}")))
        .with_panel(series("Unreachable clusters by name", "1 while a workload cluster's API "
                           "server does not answer.", "none",
                           query(f"max by (cluster) (k0s_fleet_cluster_unreachable{{{SEL}}})",
                                 "{{cluster}}")))
        # -- node upgrades ----------------------------------------------------------------
        .with_row(dashboard.Row("Node upgrades"))
        .with_panel(series(
            "Node upgrades per hour", "Started (by role), completed and failed (by reason: "
            "node, or a missed progress deadline).", "none",
            query(f"sum by (role) (increase(k0s_fleet_node_upgrades_started_total{{{SEL}}}"
                  "[1h]))", "started {{role}}"),
            query(f"sum(increase(k0s_fleet_node_upgrades_completed_total{{{SEL}}}[1h]))",
                  "completed", "B"),
            query(f"sum by (reason) (increase(k0s_fleet_node_upgrades_failed_total{{{SEL}}}"
                  "[1h]))", "failed {{reason}}", "C")))
        .with_panel(series(
            "Node upgrade duration", "From dispatch to the node on its target version and "
            "Ready: median and 90th percentile.", "s",
            query("histogram_quantile(0.5, sum by (le) (rate("
                  f"k0s_fleet_node_upgrade_duration_seconds_bucket{{{SEL}}}[{rate}])))", "p50"),
            query("histogram_quantile(0.9, sum by (le) (rate("
                  f"k0s_fleet_node_upgrade_duration_seconds_bucket{{{SEL}}}[{rate}])))", "p90",
                  "B")))
        .with_panel(series(
            "Time per node step (p90)", "How long node upgrades stay in each step "
            "(Downloading, Cordoning, Restarting...).", "s",
            query("histogram_quantile(0.9, sum by (le, phase) (rate("
                  f"k0s_fleet_node_phase_duration_seconds_bucket{{{SEL}}}[{rate}])))",
                  "{{phase}}"), width=24))
        # -- the controller process ---------------------------------------------------------
        .with_row(dashboard.Row("Controller"))
        .with_panel(series("Version", "k0s-fleet versions running (a mix during an upgrade "
                           "of k0s-fleet itself).", "none",
                           query(f"count by (version) (k0s_fleet_build_info{{{SEL}}})",
                                 "{{version}}"), width=8))
        .with_panel(series("CPU", "CPU seconds per second, per controller pod.", "none",
                           query(f"rate(process_cpu_seconds_total{{{SEL}}}[{rate}])",
                                 "{{pod}}"), width=8))
        .with_panel(series("Resident memory", "Per controller pod (the chart's limit: "
                           "resources.limits.memory).", "bytes",
                           query(f"process_resident_memory_bytes{{{SEL}}}", "{{pod}}"),
                           width=8))
        .with_panel(series(
            "Garbage collection pauses", "Share of time CPython's collector stopped the "
            "event loop, and the longest pause, per generation.", "s",
            query(f"sum by (pod, generation) (rate(python_gc_pause_seconds_total{{{SEL}}}"
                  f"[{rate}]))", "{{pod}} gen {{generation}}"),
            query(f"max by (generation) (python_gc_pause_max_seconds{{{SEL}}})",
                  "longest gen {{generation}}", "B"), width=8))
        .with_panel(series(
            "Garbage collections", "Collections per second per generation.", "none",
            query(f"sum by (generation) (rate(python_gc_collections_total{{{SEL}}}[{rate}]))",
                  "gen {{generation}}"), width=8))
        .with_panel(series(
            "Open file descriptors", "Open and maximum, per controller pod.", "none",
            query(f"process_open_fds{{{SEL}}}", "{{pod}} open"),
            query(f"process_max_fds{{{SEL}}}", "{{pod}} max", "B"), width=8))
    )
    out: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    for n, panel in enumerate(out["panels"], 1):
        panel["id"] = n  # rows included: Grafana wants each panel's id unique
    return out


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the committed JSON is not what this script writes")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run .venv/bin/python hack/dashboard.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
