"""bench/scale.py works end to end at N=2: a real management API server with CAPI's
CRDs, kubesim's virtual workload clusters, one real controller process; steady state
and a rollout measured, every node upgraded by the node agent stand-in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_scale_harness_at_two_clusters(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--clusters", "2", "--rollout",
         "--rollout-all", "--idle-seconds", "3", "--quiet-seconds", "3", "--timeout", "600",
         "--workdir", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["clusters"] == 2
    assert result["nodes"] == 20
    steady = result["steady"]
    assert steady["start_to_first_complete_status_s"] > 0
    assert steady["rss_mib"] > 20
    # The controller listed and watched both virtual clusters' Nodes.
    assert steady["workload_requests_until_idle_end"].get("watch nodes", 0) >= 2
    one = result["rollout"]["one_cluster"]
    assert one["nodes_upgraded"] == 10
    # 10 nodes upgraded one after another: every later request follows a completion.
    assert one["completion_to_next_request"]["samples"] >= 8
    assert one["workload_requests"].get("patch nodes", 0) >= 10
    # One NodePlan made per node. A create answered otherwise is counted apart by its
    # status code ("create nodeplans (409)": an AlreadyExists the dispatcher adopts after
    # its first create's answer was lost, not a second NodePlan); shown if the count is off.
    mg = one["management_requests"]
    assert mg.get("create nodeplans", 0) == 10, {
        k: v for k, v in mg.items() if k.startswith("create nodeplans")}
    assert result["rollout"]["all_clusters"]["nodes"] == 10
    # kubesim sent every watch its changes promptly (a change it held back had silenced a
    # workload cluster's Node watch for 150 s in a 10 x 300 run)
    delivery = result["rollout"]["all_clusters"]["kubesim_watch_delivery"]
    assert delivery["late_events"] == 0 and delivery["pending_oldest_seconds"] < 5, delivery


def test_scale_harness_sharded_with_a_replica_killed(tmp_path: Path) -> None:
    """Three sharded replicas, waves, one fleet-wide FleetUpgrade; one replica SIGKILLed
    mid-rollout. The node side's record (fleet.testing.rollcheck) shows every node asked
    once and no rule broken, and the killed replica's clusters went on."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--clusters", "8", "--replicas",
         "3", "--rollout", "--rollout-all", "--waves", "--kill-one", "--kill-after", "0.1",
         "--max-concurrent-clusters", "2", "--idle-seconds", "3", "--quiet-seconds", "3",
         "--timeout", "600", "--workdir", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["steady"]["start_to_every_shard_claimed_s"] > 0
    assert set(result["steady"]["replicas_at_idle_end"]) == {"bench-0", "bench-1", "bench-2"}
    every = result["rollout"]["all_clusters"]
    assert every["nodes"] == 70
    check = every["check"]
    assert check["requests_seen"] == 70, check
    assert {k: check[k] for k in ("double_dispatch", "budget", "quorum", "concurrency",
                                  "wave_order", "not_completed")} == dict.fromkeys(
        ("double_dispatch", "budget", "quorum", "concurrency", "wave_order",
         "not_completed"), 0), check
    assert check["max_clusters_at_once"]["default"] <= 2
    kill = every["kill"]
    assert kill["killed"] in {"bench-0", "bench-1", "bench-2"}, kill
    assert kill["resumed_clusters"] >= 1 and kill["handoff_s"]["max"] is not None, kill
    assert kill["killed"] not in result["processes"]


def test_scale_harness_setup_only(tmp_path: Path) -> None:
    """--setup-only: the management side and kubesim without a controller, measured; the
    management API server's extra flag reaches it (no watch cache: a list still works,
    served from etcd)."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--clusters", "3", "--setup-only",
         "--idle-seconds", "1", "--apiserver-arg=--watch-cache=false",
         "--apiserver-env", "GOGC=80", "--workdir", str(tmp_path / "work"),
         "--json", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert "steady" not in result  # no controller ran
    setup = result["setup"]
    assert setup["clusters_per_s"] > 0
    after = setup["after_idle"]
    for name in ("kube_apiserver", "etcd", "kubesim"):
        assert after[name]["rss_mib"] > 10, name
    # 3 clusters x 18 objects (+ CRDs, namespaces, the API server's own) in etcd
    assert after["etcd_db"]["etcd_debugging_mvcc_keys_total"] >= 3 * 18
    assert result["mgmt_apiserver"] == {"extra_args": ["--watch-cache=false"],
                                        "env": {"GOGC": "80"}}
    log = (tmp_path / "work" / "world" / "mgmt" / "kube-apiserver.log").read_text()
    assert 'FLAG: --watch-cache="false"' in log
    assert "cacher" not in log  # with the watch cache on, each resource logs its cacher


def test_scale_harness_keeps_what_it_measured_when_a_phase_fails(tmp_path: Path) -> None:
    """Bad input for the API server: the run fails naming why, and the JSON still says so
    (a long run stopped part-way keeps its earlier phases the same way)."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--clusters", "1", "--setup-only",
         "--apiserver-arg=--no-such-flag-for-the-bench", "--workdir", str(tmp_path / "work"),
         "--json", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode != 0
    result = json.loads(out.read_text())
    assert "kube-apiserver mgmt exited" in result["stopped"], result["stopped"]
    assert result["clusters"] == 1 and "setup" not in result
