"""The CLI's pure parts (#31): the live progress view (state -> lines, ETA from the node
times seen), -o wide's columns, the redraw on a terminal, the namespace default (-n, the
kubeconfig context's, the chart's) and the exit codes table of docs/operations.md."""

from __future__ import annotations

import argparse
import dataclasses
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
import yaml

from fleet.cli import common
from fleet.cli.plan import outcome, refusals
from fleet.cli.progress import (
    Step,
    age,
    cluster_eta,
    current_steps,
    node_durations,
    progress_state,
    render_progress,
    wide_columns,
)
from fleet.cli.upgrade import redraw_text
from fleet.config.models import ManagementSettings
from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.skew import SkewRefusal
from fleet.planner.writer import version_step
from fleet.rollout.gate import GateDecision
from fleet.rollout.plan import DryRun
from fleet.world.model import (
    ANN_WRITTEN_VERSION,
    IntentTarget,
    MachineDeploymentInfo,
    NodePlanInfo,
    ObjectRef,
)
from tests.helpers.charts import CONTROLLER_CHART, render

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def plan(name: str, cluster: str, phase: str, *, node_state: str = "",
         started: float | None = None, since: float | None = None,
         completed: float | None = None, ns: str = "fleet") -> NodePlanInfo:
    """A NodePlan; times are seconds before NOW."""
    def at(s: float | None) -> datetime | None:
        return None if s is None else NOW - timedelta(seconds=s)
    return NodePlanInfo(ref=ObjectRef("NodePlan", ns, f"{name}-v1"), cluster=cluster,
                        machine=name, node=name, role="worker", owner_kind="MachineDeployment",
                        owner_name=f"{cluster}-md", version="v1.31.3+k0s.0", phase=phase,
                        node_state=node_state, started_at=at(started), phase_since=at(since),
                        completed_at=at(completed))


def test_current_steps_are_live_nodeplans_longest_first() -> None:
    plans = [plan("a", "c1", NodePlanPhase.IN_PROGRESS, node_state="Downloading", since=10),
             plan("b", "c1", NodePlanPhase.IN_PROGRESS, node_state="Draining", since=70),
             plan("c", "c1", NodePlanPhase.COMPLETED, since=5),
             plan("d", "c2", NodePlanPhase.PENDING)]
    steps = current_steps(plans)
    assert [s.node for s in steps[("fleet", "c1")]] == ["b", "a"]
    assert steps[("fleet", "c1")][0].step == "Draining"
    assert steps[("fleet", "c2")] == [Step("d", "Pending", None)]


def test_node_durations_are_start_to_completion() -> None:
    plans = [plan("a", "c1", NodePlanPhase.COMPLETED, started=300, completed=180),
             plan("b", "c1", NodePlanPhase.COMPLETED, started=200, since=140),
             plan("c", "c1", NodePlanPhase.IN_PROGRESS, started=50),
             plan("d", "c1", NodePlanPhase.FAILED, started=400, since=10)]
    assert sorted(node_durations(plans)) == [60.0, 120.0]


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (45.9, "45s"), (60, "1m00s"), (185, "3m05s"), (3725, "1h02m"), (-3, "0s")])
def test_age(seconds: float, text: str) -> None:
    assert age(seconds) == text


def test_wide_columns() -> None:
    steps = [Step("n1", "Downloading", NOW - timedelta(seconds=42)),
             Step("n2", "Pending", None)]
    assert wide_columns(steps, ["agent", "paused-in-place", "agent"], NOW) == {
        "executor": "agent,paused-in-place", "step": "Downloading", "node": "n1 (+1)",
        "inStep": "42s"}
    assert wide_columns([], [], NOW) == {"executor": "-", "step": "-", "node": "-",
                                         "inStep": "-"}


def test_cluster_eta_counts_the_time_already_spent() -> None:
    step = [Step("n1", "Downloading", NOW - timedelta(seconds=30))]
    assert cluster_eta(3, step, 100.0, NOW) == 270.0
    assert cluster_eta(3, [], 100.0, NOW) == 300.0
    assert cluster_eta(0, [], None, NOW) == 0.0
    assert cluster_eta(2, step, None, NOW) is None
    # a node slower than the mean does not make the ETA go below the other nodes' time
    slow = [Step("n1", "Verifying", NOW - timedelta(seconds=500))]
    assert cluster_eta(2, slow, 100.0, NOW) == 100.0


def fleet_upgrade() -> dict[str, object]:
    return {"status": {
        "phase": "Progressing", "summary": "1/3", "nodesUpToDate": 4, "nodesTotal": 8,
        "waves": [{"name": "canary", "phase": "Complete", "clusters": 1, "complete": 1},
                  {"name": "prod", "phase": "Progressing", "clusters": 2, "complete": 0}],
        "clusters": [
            {"namespace": "fleet", "name": "can", "wave": "canary", "phase": "Complete",
             "nodes": "2/2"},
            {"namespace": "fleet", "name": "p1", "wave": "prod", "phase": "Upgrading",
             "nodes": "2/3", "rung": "v1.32.4+k0s.0"},
            {"namespace": "fleet", "name": "p2", "wave": "prod", "phase": "Refused",
             "nodes": "0/3", "message": "NoDowngrade: the cluster runs v1.33.0"}]}}


def test_progress_view_per_wave_and_cluster_with_eta() -> None:
    plans = [plan("can-0", "can", NodePlanPhase.COMPLETED, started=900, completed=780),
             plan("can-1", "can", NodePlanPhase.COMPLETED, started=700, completed=640),
             plan("p1-2", "p1", NodePlanPhase.IN_PROGRESS, node_state="Downloading",
                  started=40, since=25)]
    state = progress_state(fleet_upgrade(), plans, NOW)
    assert state.mean == 90.0
    lines = render_progress(state, width=200)
    # the fleet: remaining nodes at 90 s each; p1 has 1 left with 25 s spent (65 s), p2
    # (refused) 3 left (270 s): the wave takes its slowest cluster
    assert lines[0] == "Progressing: 1/3 clusters, 4/8 nodes  ETA ~4m30s (2 node(s) seen, " \
                       "1m30s each)"
    assert lines[1] == "wave canary Complete 1/1"
    assert re.fullmatch(r"  fleet/can +Complete +2/2", lines[2]), lines[2]
    assert lines[3] == "wave prod Progressing 0/2"
    assert re.fullmatch(r"  fleet/p1 +Upgrading +2/3 rung v1\.32\.4\+k0s\.0  p1-2 "
                        r"Downloading 25s  ETA ~1m05s", lines[4]), lines[4]
    assert lines[5].endswith("0/3  NoDowngrade: the cluster runs v1.33.0"), lines[5]
    # before any node has finished there is no ETA, and it says why
    first = render_progress(progress_state(fleet_upgrade(), plans[2:], NOW))[0]
    assert first.endswith("ETA: after the first node (no node time seen yet)")
    # every line fits the width
    assert all(len(line) <= 40 for line in render_progress(state, width=40))


def test_a_complete_cluster_shows_no_node_in_flight() -> None:
    """The first hour's transcript: `fleet-prod/edge-01  Complete 3/3  edge-01-md-1
    Downloading 3s` (its last NodePlan's status trailed the node, or was read before the
    FleetUpgrade's). A cluster whose nodes are all up to date has nothing in flight."""
    plans = [plan("can-1", "can", NodePlanPhase.IN_PROGRESS, node_state="Downloading",
                  started=5, since=3)]
    lines = render_progress(progress_state(fleet_upgrade(), plans, NOW), width=200)
    assert re.fullmatch(r"  fleet/can +Complete +2/2", lines[2]), lines[2]


def test_progress_view_of_a_fresh_fleet_upgrade() -> None:
    lines = render_progress(progress_state({}, [], NOW))
    assert lines == ["Pending: - clusters, 0/0 nodes"]


def test_redraw_in_place() -> None:
    assert redraw_text(0, ["a", "b"]) == "a\nb\n"
    assert redraw_text(2, ["c"]) == "\x1b[2F\x1b[Jc\n"


# -- the namespace default -----------------------------------------------------------------


def kubeconfig(path: Path, namespace: str | None) -> Path:
    ctx: dict[str, str] = {"cluster": "c", "user": "u"}
    if namespace:
        ctx["namespace"] = namespace
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "main",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "main", "context": ctx},
                     {"name": "other", "context": {"cluster": "c", "user": "u",
                                                   "namespace": "ops"}}]}))
    return path


def test_namespace_default_is_the_context_s_then_the_chart_s(tmp_path: Path) -> None:
    with_ns = kubeconfig(tmp_path / "a.yaml", "fleet-controller")
    env = {"KUBECONFIG": str(with_ns)}
    m = ManagementSettings()
    assert common.default_namespace(m, env)[0] == "fleet-controller"
    # --context picks another context, and its namespace
    assert common.default_namespace(ManagementSettings(context="other"), env)[0] == "ops"
    without = kubeconfig(tmp_path / "b.yaml", None)
    ns, why = common.default_namespace(m, {"KUBECONFIG": str(without)})
    assert (ns, why) == ("k0s-fleet-system", "the chart's default namespace")
    # in a Pod: the service account's namespace
    sa = tmp_path / "namespace"
    sa.write_text("fleet-ops\n")
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert common.default_namespace(m, pod, service_account_namespace=sa)[0] == "fleet-ops"
    assert common.default_namespace(m, pod, service_account_namespace=tmp_path / "absent"
                                    )[0] == "k0s-fleet-system"


def test_context_namespace() -> None:
    kc = {"current-context": "a", "contexts": [
        {"name": "a", "context": {"namespace": "x"}}, {"name": "b", "context": {}}]}
    assert common.context_namespace(kc, None) == "x"
    assert common.context_namespace(kc, "b") is None
    assert common.context_namespace(kc, "missing") is None
    assert common.context_namespace({}, None) is None


def test_a_broken_controller_config_names_the_configmap() -> None:
    local = common.with_namespace(common.fleet_config(argparse.Namespace(
        config=None, kubeconfig=None, context=None, namespace=None)), "ns")
    cfg = common.config_from_text("rollout:\n  maxConcurrentClusters: 3\n", "ConfigMap ns/x",
                                  local)
    assert cfg.rollout.max_concurrent_clusters == 3
    assert cfg.management.namespace == "ns"
    with pytest.raises(common.ConfigError) as e:
        common.config_from_text("rollout:\n  pased: true\n", "ConfigMap ns/x", local)
    assert all(line.startswith("ConfigMap ns/x") or "rollout" in line
               for line in str(e.value).splitlines()), str(e.value)
    assert "pased" in str(e.value)


# -- a preview's exit code -----------------------------------------------------------------


def preview_doc(refused: list[dict[str, str]], selected: list[str] | None
                ) -> dict[str, object]:
    d: dict[str, object] = {"refusals": refused}
    if selected is not None:
        d["preview"] = {"fleetUpgrade": "ns/upgrade-v1", "clusters": selected}
    return d


def test_preview_exits_1_on_a_refusal_or_no_cluster() -> None:
    refused = [{"cluster": "ns/b", "rule": "NoDowngrade", "message": "..."}]
    assert outcome("upgrade", preview_doc([], ["ns/a"])) == common.Exit.OK
    assert outcome("upgrade", preview_doc(refused, ["ns/a", "ns/b"])) == common.Exit.FAILED
    assert outcome("upgrade", preview_doc([], [])) == common.Exit.FAILED
    # plan without a preview is a view: 0 even with a refusal
    assert outcome("plan", preview_doc(refused, None)) == common.Exit.OK


def test_refusals_name_the_rule_and_the_versions() -> None:
    t = IntentTarget(ObjectRef("FleetUpgrade", "ns", "u"), "v1.30.5+k0s.0",
                     refusal=("NoDowngrade", "the cluster runs v1.31.2+k0s.0, newer than "
                              "v1.30.5+k0s.0; k0s is never downgraded"))
    run = DryRun(start=NOW, decision=cast(GateDecision, None), clusters=[],
                 intents={("ns", "b"): t, ("ns", "a"): dataclasses.replace(t, refusal=None)})
    assert refusals(run) == [{"cluster": "ns/b", "rule": "NoDowngrade", "message": (
        "the cluster runs v1.31.2+k0s.0, newer than v1.30.5+k0s.0; k0s is never downgraded")}]
    # an object whose version the writer would not write names its rule too (as
    # fleet/planner/writer.py words it); a cluster refused as a whole is named once
    skew = SkewRefusal("WorkersNotNewerThanControlPlanes", "the workers would move to "
                       "v1.32.1+k0s.0 while the oldest control plane runs v1.31.2+k0s.0")
    md = MachineDeploymentInfo(
        ref=ObjectRef("MachineDeployment", "ns", "a-md"), cluster="a", replicas=2,
        version="v1.32.1+k0s.0", max_unavailable=1, spec_version="v1.31.2+k0s.0",
        annotations={ANN_WRITTEN_VERSION: "v1.31.2+k0s.0"})
    step = version_step(md, hold=None, write_blocked="", skew=skew)
    assert step.waiting is not None and "WorkersNotNewerThanControlPlanes" in step.waiting
    doc = {"waves": [{"clusters": [
        {"namespace": "ns", "name": "a", "objects": [
            {"kind": "MachineDeployment", "name": "a-md", "waiting": step.waiting},
            {"kind": "MachineDeployment", "name": "a-md2", "waiting": "held: paused"}]},
        {"namespace": "ns", "name": "b", "objects": [
            {"kind": "MachineDeployment", "name": "b-md", "waiting": step.waiting}]}]}]}
    assert refusals(run, doc)[1:] == [{
        "cluster": "ns/a", "object": "MachineDeployment a-md",
        "rule": "WorkersNotNewerThanControlPlanes", "message": skew.message}]


# -- docs/operations.md's exit codes are the code's ------------------------------------------


def test_the_documented_exit_codes_are_the_code_s() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    after = text.split("Exit codes (also at the end of each command's `--help`):", 1)[1]
    table = after.strip().split("\n\n", 1)[0]
    documented = [int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.M)]
    assert documented == [int(e) for e in common.Exit]
    help_codes = [int(m) for m in re.findall(r"^  (\d+) ", common.EXIT_CODES_HELP, re.M)]
    assert help_codes == documented
    # what dry runs end with is in the table
    assert "--dry-run" in table


# -- the chart's settings next to its ConfigMap ----------------------------------------------


def test_the_chart_s_environment_completes_the_controller_s_config(tmp_path: Path) -> None:
    """The keys the chart sets in the controller's environment (extension.*), taken from
    the Deployment helm renders, over the fleet YAML of the ConfigMap it renders."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"extension": {"enabled": True},
                                      "fleet": {"rollout": {"maxConcurrentClusters": 3}}}))
    manifest = render(CONTROLLER_CHART, values, release="k0s-fleet", namespace="ops")
    (cm,) = [d for d in manifest.all("ConfigMap") if "fleet.yaml" in d["data"]]
    deploy = manifest.one("Deployment")
    env = common.deployment_environment(deploy, cm["metadata"]["name"])
    assert env is not None
    assert env["K0S_FLEET_EXTENSION__ENABLED"] == "true"
    assert not any(k.startswith("K0S_FLEET_MANAGEMENT__") for k in env)
    assert "K0S_FLEET_CONFIG" not in env
    local = common.with_namespace(common.fleet_config(argparse.Namespace(
        config=None, kubeconfig=None, context=None, namespace=None)), "ops")
    cfg = common.config_from_text(cm["data"]["fleet.yaml"], "ConfigMap ops/k0s-fleet", local,
                                  env)
    assert cfg.extension.enabled and cfg.extension.service_namespace == "ops"
    assert cfg.extension.service_name == env["K0S_FLEET_EXTENSION__SERVICE_NAME"]
    assert cfg.rollout.max_concurrent_clusters == 3
    assert cfg.management.namespace == "ops"
    # a Deployment that does not mount the ConfigMap says nothing about it
    assert common.deployment_environment(deploy, "another") is None
