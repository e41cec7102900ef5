"""Scale benchmark: one controller process against N CAPI clusters of 3 + 7 nodes.

    .venv/bin/python bench/scale.py --clusters 100 [--rollout] [--replicas 1]
                                    [--idle-seconds 60] [--json out.json]
    make bench-scale CLUSTERS=100 ARGS="--rollout"

What is real: the management cluster (etcd + kube-apiserver from the test world, with
Cluster API's real CRDs and an audit log of the controller's own requests), and the
controller (``k0s-fleet controller`` in its own process with its own fleet YAML; one
replica without leader election, several with it). What stands in: the N workload
clusters are virtual clusters of kubesim (:mod:`fleet.testing.kubesim`, its own
process; the client-layer tests run against it and the real API server alike) holding
realistic ~14 KB Nodes, and the node agents are kubesim's stand-in (walks the signal
protocol to Completed, ``--step-seconds`` per step). Each cluster: Cluster, kubeconfig
Secret (pointing at its virtual cluster), K0sControlPlane stand-in with 3 control-plane
Machines, MachineDeployment (maxUnavailable 1) with a MachineSet and 7 worker Machines,
one Node per Machine, all at V1.

Measured (controller process from /proc; API requests counted at the servers):

* steady state: start -> first complete status (``/status`` says N clusters, 10 N nodes,
  all up to date), the controller's writes to the management cluster after start (audit
  log; "quiet after" = its last write before a ``--quiet-seconds`` silence), RSS, CPU
  during start-up and per idle minute, ``/healthz`` round-trip while idle (includes the
  event loop's lag: the endpoint is served by the controller's one loop);
* ``--rollout``: one cluster bumped to V2 while the others stay idle: a node's Completed
  -> the next request in that cluster (its median, p99, max), API requests per node
  upgrade (management audit log + kubesim's request log for that cluster), the time to
  roll it; with ``--rollout-all`` every other cluster is bumped next: the time to roll
  all (``--max-concurrent-clusters``, the fleet's ``rollout.maxConcurrentClusters``),
  asked for by one fleet-wide FleetUpgrade, and checked from the node side's record
  (:mod:`fleet.testing.rollcheck`: one request per node, maxUnavailable, one control
  plane at a time, maxConcurrentClusters per wave, wave order);
* ``--replicas R`` (R > 1): R sharded replicas (``--shards``, default 8 per replica;
  ``--shards 0``: one leader); ``--waves``: waves canary / early / default;
  ``--kill-one``: SIGKILL the replica holding the most clusters mid-rollout and measure
  how long its clusters waited for their next request (hand-off) against the lease.
  A replica that exits on its own is started again (as Kubernetes restarts a Pod) and
  listed in ``replicas_exited_on_their_own``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import yaml  # noqa: E402

from bench.stats import percentile  # noqa: E402
from fleet.controllers.shard import GROUP_LABEL, shard_lease_name, shard_of  # noqa: E402
from fleet.kube import KubeClient, UnreachableError  # noqa: E402
from fleet.kube.errors import ServerError  # noqa: E402
from fleet.kube.resources import CLUSTERS, FLEET_UPGRADES, LEASES, NAMESPACES  # noqa: E402
from fleet.testing.capi import FleetCluster, bump, create_cluster  # noqa: E402
from fleet.testing.rollcheck import NodeRun, Topology, check, handoffs  # noqa: E402
from fleet.testing.world import ApiServer, World, free_port, kill_group  # noqa: E402
from tests.helpers.charts import (  # noqa: E402
    CLUSTER_ROLE_BINDINGS,
    FLOW_SCHEMAS,
    PRIORITY_LEVELS,
    helm,
)

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
NAMESPACE = "bench"
CONTROLLER_USER = "k0s-fleet-controller"
CONTROL_PLANES, WORKERS = 3, 7
LEASE_GROUP = "k0s-fleet-controller"  # ShardMembership's default group
WAVE_LABEL = "bench.k0s-fleet.io/wave"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})

# With --apf builtin|chart the controllers are the chart's ServiceAccount as API Priority
# and Fairness sees it (a token user of that name and groups: not system:masters, which
# APF exempts), bound to cluster-admin.
APF_RELEASE, APF_SERVICE_ACCOUNT = "bench", "k0s-fleet-bench"
APF_USER = f"system:serviceaccount:{NAMESPACE}:{APF_SERVICE_ACCOUNT}"
APF_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
              "system:authenticated"]


def audit_policy(user: str) -> dict[str, Any]:
    return {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived", "ResponseStarted"],
            "rules": [{"level": "Metadata", "users": [user]}, {"level": "None"}]}


def cluster_name(i: int) -> str:
    return f"bench-{i:05d}"


def wave_of(i: int, n: int) -> str:
    """With --waves: the first 1 % of the clusters (at least one) form wave ``canary``,
    the next 9 % (at least one) ``early``, the rest the final ``default`` wave."""
    canary = max(1, n // 100)
    early = canary + max(1, n // 10 - canary)
    return "canary" if i < canary else "early" if i < early else "default"


def waves_config(args: argparse.Namespace) -> list[dict[str, Any]]:
    if not args.waves:
        return []
    return [{"name": w, "clusterSelector": {"matchLabels": {WAVE_LABEL: w}}}
            for w in ("canary", "early")]


def node_names(cluster: str) -> list[tuple[str, bool]]:
    """The Nodes create_cluster's Machines point at (prefix = cluster name)."""
    return [(f"{cluster}-cp-{i}", True) for i in range(CONTROL_PLANES)] + \
        [(f"{cluster}-md-{i}", False) for i in range(WORKERS)]


def completion_gaps(seen: list[tuple[str, float]], completed: list[tuple[str, float]]
                    ) -> list[float]:
    """Per request that followed a completion: its first sighting minus the latest
    completion before it, when no other request came in between (one cluster's
    (node, time) lists; a request dispatched alongside another is not a gap)."""
    events = sorted([(t, 1, n) for n, t in seen] + [(t, 0, n) for n, t in completed])
    gaps: list[float] = []
    last_done: float | None = None
    for t, is_request, _node in events:
        if is_request:
            if last_done is not None:
                gaps.append(t - last_done)
            last_done = None
        else:
            last_done = t
    return gaps


# -- the audit log (management cluster, the controller's requests only) ------------------

@dataclass
class AuditReader:
    path: Path
    offset: int = 0

    def read(self) -> list[dict[str, Any]]:
        """Audit events appended since the last read (whole lines only)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


def audit_time(ev: dict[str, Any]) -> float:
    return datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")
                                  ).timestamp()


def describe(ev: dict[str, Any]) -> str:
    """``<verb> <resource>``; a request the server refused or failed also says its status
    code (``create nodeplans (409)``: an AlreadyExists the dispatcher adopted, not a second
    NodePlan), so a row counts only what it says."""
    ref = ev.get("objectRef") or {}
    res = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource")
                                      else "")
    code = int((ev.get("responseStatus") or {}).get("code") or 0)
    return f"{ev.get('verb')} {res}" + (f" ({code})" if code >= 300 else "")


def is_write(ev: dict[str, Any]) -> bool:
    """A write of fleet state (Lease renewals of the leader election are not)."""
    return ev.get("verb") in WRITE_VERBS and \
        (ev.get("objectRef") or {}).get("resource") != "leases"


def latency_s(ev: dict[str, Any]) -> float | None:
    """Seconds from the server receiving a request to its response (audit stage
    ResponseComplete); None for an event of another stage."""
    if ev.get("stage") != "ResponseComplete" or "stageTimestamp" not in ev:
        return None
    done = datetime.fromisoformat(ev["stageTimestamp"].replace("Z", "+00:00")).timestamp()
    return done - audit_time(ev)


def write_profile(events: list[dict[str, Any]]) -> dict[str, Any]:
    """How the API server answered the controllers' Lease updates and their other writes
    (latency percentiles, 5xx), and how the writes were spread: the most in one second
    and in any 10 s."""
    def summary(evs: list[dict[str, Any]]) -> dict[str, Any]:
        lat = sorted(x for x in (latency_s(e) for e in evs) if x is not None)
        if not lat:
            return {"count": 0}

        def q(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3)

        return {"count": len(lat), "median": q(0.5), "p90": q(0.9), "p99": q(0.99),
                "max": round(lat[-1], 3),
                "5xx": sum(1 for e in evs
                           if int((e.get("responseStatus") or {}).get("code") or 0) >= 500),
                "429": sum(1 for e in evs
                           if int((e.get("responseStatus") or {}).get("code") or 0) == 429)}

    leases = [e for e in events if e.get("verb") == "update"
              and (e.get("objectRef") or {}).get("resource") == "leases"]
    writes = [e for e in events if is_write(e)]
    seconds = Counter(int(audit_time(e)) for e in writes)
    tens = max((sum(seconds.get(t + k, 0) for k in range(10)) for t in seconds), default=0)
    return {"lease_updates": summary(leases), "writes": summary(writes),
            "writes_max_per_1s": max(seconds.values(), default=0),
            "writes_max_per_10s": tens}


# -- processes ------------------------------------------------------------------------

def proc_usage(pid: int) -> dict[str, float] | None:
    """CPU seconds, RSS and peak RSS (MiB) of a process from /proc; None once it is gone
    (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    mem = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            mem[key] = int(value.split()[0]) / 1024
    if "VmRSS" not in mem:
        return None
    return {"cpu_s": (int(fields[11]) + int(fields[12])) / ticks,
            "rss_mib": mem["VmRSS"], "peak_rss_mib": mem.get("VmHWM", math.nan)}


# -- the controller process -----------------------------------------------------------

@dataclass
class Controller:
    identity: str
    proc: subprocess.Popen[bytes]
    status_port: int
    started_wall: float
    started: float = field(default_factory=time.monotonic)
    last: dict[str, float] = field(default_factory=lambda: {
        "cpu_s": 0.0, "rss_mib": math.nan, "peak_rss_mib": math.nan})

    def usage(self) -> dict[str, float]:
        """CPU seconds, RSS and peak RSS (MiB) of the process, from /proc (the last
        reading once the process is gone)."""
        now = proc_usage(self.proc.pid)
        if now is not None:
            self.last = now
        return dict(self.last)

    def alive(self) -> bool:
        return self.proc.poll() is None


def controller_command() -> list[str]:
    script = Path(sys.executable).parent / "k0s-fleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fleet.cli"]


def start_controller(identity: str, workdir: Path, kubeconfig: Path,
                     args: argparse.Namespace) -> Controller:
    port = free_port()
    deadlines = dict.fromkeys(("pending", "downloading", "cordoning", "applyingUpdate",
                               "restarting", "verifying", "unCordoning"), "120s")
    config = {
        "management": {"namespace": NAMESPACE},
        "clusters": {"namespaces": [NAMESPACE]},
        "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                     "allowUnverified": True},
        "agent": {"drainTimeout": "30s", "verifyTimeout": "30s"},
        "rollout": {"progressDeadlines": deadlines,
                    "maxConcurrentClusters": args.max_concurrent_clusters,
                    "waves": waves_config(args)},
        "status": {"port": port},
    }
    cfg = workdir / f"fleet-{identity}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    log = (workdir / f"controller-{identity}.log").open("ab")  # a restarted replica appends
    started_wall = time.time()
    # One replica runs without a Lease: on this shared machine a renewal can miss its
    # 10 s deadline and the controller then exits by design (docs/controller.md).
    # Several: sharded (every replica acts on its share) unless --shards 0 (one leads).
    election = ["--no-leader-elect"] if args.replicas == 1 else \
        ["--lease-seconds", str(args.lease_seconds)] + \
        (["--shards", str(args.shards)] if args.shards else [])
    proc = subprocess.Popen(
        [*controller_command(), "controller", "--config", str(cfg), "--kubeconfig",
         str(kubeconfig), "--identity", identity, "--log-level", args.controller_log_level,
         *election, *args.controller_arg],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=str(REPO))
    log.close()
    return Controller(identity, proc, port, started_wall)


# -- kubesim ----------------------------------------------------------------------------

@dataclass
class Sim:
    proc: subprocess.Popen[bytes]
    port: int
    token: str
    ca_pem: bytes

    def kubeconfig(self, cluster: str) -> dict[str, Any]:
        import base64  # noqa: PLC0415

        return {"apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": cluster, "cluster": {
                    "server": f"https://127.0.0.1:{self.port}/clusters/{cluster}",
                    "certificate-authority-data": base64.b64encode(self.ca_pem).decode()}}],
                "users": [{"name": "admin", "user": {"token": self.token}}],
                "contexts": [{"name": cluster, "context": {"cluster": cluster,
                                                          "user": "admin"}}],
                "current-context": cluster}

    async def admin(self, session: aiohttp.ClientSession, path: str) -> Any:
        async with session.get(f"https://127.0.0.1:{self.port}{path}",
                               headers={"Authorization": f"Bearer {self.token}"}) as r:
            r.raise_for_status()
            return await r.json()


def start_sim(workdir: Path, clusters: list[str], step_seconds: float) -> Sim:
    """kubesim in its own process, seeded with every cluster's Nodes (blocking)."""
    seed = {"clusters": [{"name": c, "nodes": [
        {"name": n, "version": V1, "controlPlane": cp} for n, cp in node_names(c)]}
        for c in clusters]}
    sim_dir = workdir / "kubesim"
    sim_dir.mkdir(parents=True, exist_ok=True)
    (sim_dir / "seed.json").write_text(json.dumps(seed))
    token = secrets.token_hex(16)
    log = (sim_dir / "kubesim.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.testing.kubesim", "--workdir", str(sim_dir),
         "--seed", str(sim_dir / "seed.json"), "--standin", "--step-seconds",
         str(step_seconds)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        cwd=str(REPO), env={**os.environ, "KUBESIM_TOKEN": token, "PYTHONPATH": str(REPO)})
    log.close()
    ready = sim_dir / "ready.json"
    deadline = time.monotonic() + 600
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"kubesim exited with {proc.returncode}; see {sim_dir}")
        if time.monotonic() > deadline:
            kill_group(proc)
            raise TimeoutError("kubesim did not come up in 600 s")
        time.sleep(0.1)
    info = json.loads(ready.read_text())
    return Sim(proc, int(info["port"]), token, Path(info["ca"]).read_bytes())


def sim_requests(stats: dict[str, Any], cluster: str | None = None) -> Counter[str]:
    out: Counter[str] = Counter()
    for row in stats["requests"]:
        if cluster is None or row["cluster"] == cluster:
            out[f"{row['verb']} {row['resource']}"] += int(row["count"])
    return out


# -- the run ----------------------------------------------------------------------------

async def create_fleet(mgmt: KubeClient, sim: Sim, clusters: list[str], *,
                       concurrency: int = 8, waves: bool = False,
                       progress: list[int] | None = None) -> list[FleetCluster]:
    """Every cluster written (``concurrency`` at once); ``progress[0]`` counts the ones
    done so far, for a sampler to read."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, name: str) -> FleetCluster:
        async with sem:
            for attempt in range(1, 6):
                try:
                    # No Nodes written through the client: kubesim was seeded with them.
                    # Safe to repeat: what exists already is read back, not re-created.
                    fc = await create_cluster(
                        mgmt, mgmt, sim.kubeconfig(name), namespace=NAMESPACE, name=name,
                        version=V1, control_planes=CONTROL_PLANES, workers=WORKERS,
                        max_unavailable=1, create_nodes=False)
                    wave = wave_of(i, len(clusters))
                    if waves and wave != "default":
                        await mgmt.patch(CLUSTERS, name, {"metadata": {"labels": {
                            WAVE_LABEL: wave}}}, NAMESPACE)
                    if progress is not None:
                        progress[0] += 1
                    return fc
                except (UnreachableError, ServerError):
                    if attempt == 5:
                        raise
                    await asyncio.sleep(2.0 * attempt)
            raise AssertionError("unreachable")

    return list(await asyncio.gather(*(one(i, c) for i, c in enumerate(clusters))))


async def get_status(session: aiohttp.ClientSession, c: Controller) -> dict[str, Any] | None:
    try:
        async with session.get(f"http://127.0.0.1:{c.status_port}/status",
                               timeout=aiohttp.ClientTimeout(total=10)) as r:
            return await r.json() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def complete(doc: dict[str, Any] | None, clusters: int) -> bool:
    if not doc:
        return False
    s = doc.get("summary") or {}
    nodes = clusters * (CONTROL_PLANES + WORKERS)
    return s.get("clusters") == clusters and s.get("nodes") == nodes and \
        s.get("nodesUpToDate") == nodes and (s.get("clustersUnreachable") or 0) == 0


async def leader_status(session: aiohttp.ClientSession, controllers: list[Controller]
                        ) -> tuple[Controller | None, dict[str, Any] | None]:
    for c in controllers:
        doc = await get_status(session, c)
        if doc is not None:
            return c, doc
    return None, None


async def wait_quiet(audit: AuditReader, events: list[dict[str, Any]], quiet: float,
                     deadline: float) -> float | None:
    """Collect audit events until the controller wrote nothing for ``quiet`` seconds;
    the wall time of its last write (None if it never wrote)."""
    last_write = max((audit_time(e) for e in events if is_write(e)), default=None)
    while time.monotonic() < deadline:
        fresh = audit.read()
        events.extend(fresh)
        writes = [audit_time(e) for e in fresh if is_write(e)]
        if writes:
            last_write = max([*writes, last_write or 0.0])
        if time.time() - (last_write or 0.0) >= quiet:
            return last_write
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the controller still writes after the deadline (last write "
                       f"{time.time() - (last_write or 0):.1f} s ago)")


async def probe_latency(session: aiohttp.ClientSession, c: Controller, seconds: float,
                        stop: asyncio.Event | None = None) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (stop is not None and stop.is_set()):
        t0 = time.monotonic()
        try:
            async with session.get(f"http://127.0.0.1:{c.status_port}/healthz",
                                   timeout=aiohttp.ClientTimeout(total=30)) as r:
                await r.read()
            out.append(time.monotonic() - t0)
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.5)
    return out


def ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"samples": 0}
    return {"median_ms": round(percentile(values, 0.5) * 1000, 1),
            "p99_ms": round(percentile(values, 0.99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1), "samples": len(values)}


async def wait_rolled(r: Run, clusters: set[str]) -> float:
    """Seconds until every node of ``clusters`` reported Completed to the stand-in (the
    node side's truth) and the controller's status then counts them all up to date."""
    t0 = time.monotonic()
    nodes_per = CONTROL_PLANES + WORKERS
    while time.monotonic() - t0 < r.args.timeout:
        t_poll = time.monotonic()
        report = await r.sim.admin(r.session, "/kubesim/standin")
        done = Counter(row[0] for row in report["completed"] if row[0] in clusters)
        if len(done) == len(clusters) and all(v >= nodes_per for v in done.values()):
            _, doc = await leader_status(r.session, r.controllers)
            if doc is not None and all(cluster_done(doc, c) for c in clusters):
                return time.monotonic() - t0
        check_exits(r)
        # The stand-in's report is served by kubesim's one loop: poll at most a fifth of
        # the time (at 10 000 nodes it is a few MB of JSON).
        await asyncio.sleep(max(0.5, 4 * (time.monotonic() - t_poll)))
    raise TimeoutError(f"rollout of {len(clusters)} cluster(s) not done within "
                       f"{r.args.timeout:.0f} s")


def check_exits(r: Run) -> None:
    """A replica of several that exited without the harness killing it is recorded and
    started again under the same identity, as Kubernetes restarts a Pod (a sharded
    replica exits by design when its member Lease was not renewed in time: on this
    shared machine, a starved process); with one replica the run stops."""
    for i, c in enumerate(r.controllers):
        if c.identity in r.killed or c.alive():
            continue
        if len(r.controllers) == 1:
            raise RuntimeError(f"the controller exited with {c.proc.returncode}; see its "
                               "log in the workdir")
        r.exited.append({"identity": c.identity, "code": c.proc.returncode,
                         "after_start_s": round(time.monotonic() - c.started, 1),
                         "cpu_s": round(c.usage()["cpu_s"], 2)})
        r.controllers[i] = start_controller(c.identity, r.workdir, r.kubeconfig, r.args)


def cluster_done(doc: dict[str, Any], name: str) -> bool:
    for wave in doc.get("waves") or []:
        for c in wave.get("clusters") or []:
            if c.get("name") == name:
                return bool(c.get("upToDate") == c.get("nodes") == CONTROL_PLANES + WORKERS
                            and not c.get("inFlight"))
    return False


def prepare(workdir: Path, user: str) -> tuple[Path, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(audit_policy(user)))
    return workdir / "audit.log", policy


async def install_apf(mgmt: KubeClient, user: str, *, chart: bool) -> dict[str, Any]:
    """--apf: ``user`` bound to cluster-admin; with ``chart``, the chart's FlowSchema and
    PriorityLevelConfiguration for the Lease requests, rendered by the real helm (release
    APF_RELEASE, ServiceAccount APF_SERVICE_ACCOUNT in NAMESPACE) and created."""
    await mgmt.create(CLUSTER_ROLE_BINDINGS, {
        "metadata": {"name": "k0s-fleet-bench-controller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": user}]})
    if not chart:
        return {"user": user, "objects": []}
    rendered = await asyncio.to_thread(lambda: helm(
        "template", APF_RELEASE, REPO / "charts" / "k0s-fleet", "--namespace", NAMESPACE,
        "--show-only", "templates/flowschema.yaml",
        "--api-versions", "flowcontrol.apiserver.k8s.io/v1",
        "--set", f"serviceAccount.name={APF_SERVICE_ACCOUNT}",
        "--set", "rbac.secrets.clusterWide=true").stdout)  # the bench's fleet: every namespace
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {"PriorityLevelConfiguration": PRIORITY_LEVELS, "FlowSchema": FLOW_SCHEMAS}
    for doc in sorted(docs, key=lambda d: d["kind"] != "PriorityLevelConfiguration"):
        await mgmt.create(kinds[doc["kind"]], doc)
    return {"user": user, "objects": [f"{d['kind']}/{d['metadata']['name']}" for d in docs]}


@dataclass
class Run:
    """What the phases share."""

    args: argparse.Namespace
    session: aiohttp.ClientSession
    mgmt: KubeClient
    sim: Sim
    controllers: list[Controller]
    audit: AuditReader
    workdir: Path = Path()
    kubeconfig: Path = Path()
    killed: set[str] = field(default_factory=set)  # identities the harness SIGKILLed
    exited: list[dict[str, Any]] = field(default_factory=list)  # exits on their own
    result: dict[str, Any] = field(default_factory=dict)  # what is measured so far


async def run(args: argparse.Namespace, workdir: Path, result: dict[str, Any]
              ) -> dict[str, Any]:
    """The whole run; ``result`` fills as the phases end (main writes what is in it
    when a phase fails or the run is interrupted)."""
    n = args.clusters
    names = [cluster_name(i) for i in range(n)]
    user = CONTROLLER_USER if args.apf == "off" else APF_USER
    audit_path, policy = await asyncio.to_thread(prepare, workdir, user)
    controller_token = secrets.token_hex(16)
    apf = [] if args.apf == "off" else ["--enable-priority-and-fairness=true"]  # later wins
    world = World(["mgmt"], workdir=workdir / "world", users={user: controller_token},
                  groups={} if args.apf == "off" else {user: APF_GROUPS},
                  extra_args={"mgmt": [f"--audit-log-path={audit_path}",
                                       f"--audit-policy-file={policy}",
                                       "--audit-log-maxsize=0", *apf, *args.apiserver_arg]})
    world["mgmt"].env = dict(args.apiserver_env)
    result.update({
        "clusters": n, "nodes": n * (CONTROL_PLANES + WORKERS), "replicas": args.replicas,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "loadavg_start": os.getloadavg()},
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    })
    if args.apiserver_arg or args.apiserver_env:
        result["mgmt_apiserver"] = {"extra_args": args.apiserver_arg,
                                    "env": dict(args.apiserver_env)}
    sim: Sim | None = None
    controllers: list[Controller] = []
    t_setup = time.monotonic()
    await asyncio.to_thread(world.start)
    sampler: Sampler | None = None
    try:
        await world.install_crds()
        t_sim = time.monotonic()
        sim = await asyncio.to_thread(start_sim, workdir, names, args.step_seconds)
        t_sim = time.monotonic() - t_sim
        sampler = Sampler(world, sim)
        sampler.start()
        async with await world["mgmt"].client() as mgmt:
            await mgmt.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
            if args.apf != "off":
                result["apf"] = await install_apf(mgmt, user, chart=args.apf == "chart")
            t_create = time.monotonic()
            fleet = await create_fleet(mgmt, sim, names, concurrency=args.create_concurrency,
                                       waves=args.waves, progress=sampler.progress)
            t_create = time.monotonic() - t_create
            result["setup_s"] = round(time.monotonic() - t_setup, 1)
            result["setup"] = {"kubesim_seed_s": round(t_sim, 1),
                               "create_s": round(t_create, 1),
                               "create_concurrency": args.create_concurrency,
                               "clusters_per_s": round(n / t_create, 2),
                               "during": sampler.summary()}
            if args.setup_only:
                result["setup"]["after_idle"] = await settle_and_measure(
                    world, sim, sampler, args.idle_seconds)
                return result
            kubeconfig = workdir / "controller-kubeconfig.yaml"
            await asyncio.to_thread(kubeconfig.write_text, yaml.safe_dump(
                world["mgmt"].kubeconfig(token=controller_token, user=user)))
            audit = AuditReader(audit_path)
            audit.read()  # nothing of the controller's yet; skip to the end
            connector = aiohttp.TCPConnector(ssl=False, limit=8)
            async with aiohttp.ClientSession(connector=connector) as session:
                sim_before = await sim.admin(session, "/kubesim/stats")
                seeded = proc_usage(sim.proc.pid)
                if seeded is not None:  # kubesim before any controller connects
                    result["kubesim_seeded"] = {k: round(v, 1) for k, v in seeded.items()}
                for i in range(args.replicas):
                    if i and args.stagger_seconds:
                        await asyncio.sleep(args.stagger_seconds)
                    controllers.append(await asyncio.to_thread(
                        start_controller, f"bench-{i}", workdir, kubeconfig, args))
                r = Run(args, session, mgmt, sim, controllers, audit, workdir=workdir,
                        kubeconfig=kubeconfig, result=result)
                result.update(await steady(r, n))
                sim_after = await sim.admin(session, "/kubesim/stats")
                result["steady"]["workload_requests_until_idle_end"] = dict(
                    sim_requests(sim_after) - sim_requests(sim_before))
                if args.rollout:
                    result["rollout"] = await rollout(r, fleet)
                result["replicas_exited_on_their_own"] = r.exited
                # the test world's side over the whole run (set-up included)
                result["world_during_run"] = sampler.summary()
                for c in controllers:
                    if c.alive():
                        result.setdefault("processes", {})[c.identity] = {
                            k: round(v, 2) for k, v in c.usage().items()}
    finally:
        if args.apf != "off":
            with contextlib.suppress(Exception):  # the run's own failure says more
                result.setdefault("apf", {})["levels"] = apf_levels(
                    await apiserver_metrics(world["mgmt"]))
        if sampler is not None:
            sampler.stop()
        for c in controllers:
            kill_group(c.proc)
        if sim is not None:
            kill_group(sim.proc)
        await asyncio.to_thread(world.close)
        result["host"]["loadavg_end"] = os.getloadavg()
        result["workdir"] = str(workdir)
    return result


class Sampler:
    """Every 2 s during set-up: the 1-minute load average and the RSS of the management
    kube-apiserver, its etcd and kubesim, and how many clusters are written."""

    def __init__(self, world: World, sim: Sim, every: float = 2.0) -> None:
        self.pids = {"kube_apiserver": world["mgmt"].proc, "etcd": world.etcd.proc,
                     "kubesim": sim.proc}
        self.every = every
        self.progress = [0]
        self.rows: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None
        self.t0 = time.monotonic()

    def sample(self) -> dict[str, float]:
        row = {"t": round(time.monotonic() - self.t0, 1), "load1": os.getloadavg()[0],
               "clusters": self.progress[0]}
        for name, proc in self.pids.items():
            u = proc_usage(proc.pid) if proc is not None else None
            if u is not None:
                row[f"{name}_rss_mib"] = round(u["rss_mib"], 1)
                row[f"{name}_cpu_s"] = round(u["cpu_s"], 1)
        return row

    async def _loop(self) -> None:
        while True:
            self.rows.append(self.sample())
            await asyncio.sleep(self.every)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def summary(self) -> dict[str, Any]:
        """Load average (mean, max) and each process's highest RSS over the samples so
        far, and the CPU seconds each spent."""
        rows = self.rows or [self.sample()]
        out: dict[str, Any] = {
            "samples": len(rows),
            "load1_mean": round(sum(r["load1"] for r in rows) / len(rows), 2),
            "load1_max": round(max(r["load1"] for r in rows), 2)}
        for name in self.pids:
            rss = [r[f"{name}_rss_mib"] for r in rows if f"{name}_rss_mib" in r]
            cpu = [r[f"{name}_cpu_s"] for r in rows if f"{name}_cpu_s" in r]
            if rss:
                out[f"{name}_max_rss_mib"] = max(rss)
                out[f"{name}_cpu_s"] = round(cpu[-1] - cpu[0], 1)
        return out


async def etcd_db_bytes(session: aiohttp.ClientSession, world: World) -> dict[str, int]:
    """etcd's own gauges of its backend: total size and the part in use."""
    async with session.get(f"{world.etcd.url}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        for key in ("etcd_mvcc_db_total_size_in_bytes",
                    "etcd_mvcc_db_total_size_in_use_in_bytes", "etcd_debugging_mvcc_keys_total"):
            if line.startswith(key + " "):
                out[key] = int(float(line.split()[1]))
    return out


def apf_levels(metrics: str) -> dict[str, dict[str, Any]]:
    """Per API Priority and Fairness level, from the server's /metrics text: requests
    dispatched and rejected, and their wait for a seat (mean, and the upper bound of the
    histogram bucket holding the 99th percentile)."""
    levels: dict[str, dict[str, Any]] = {}
    buckets: dict[str, dict[float, float]] = {}

    def label(labels: str, name: str) -> str:
        return labels.split(f'{name}="', 1)[1].split('"', 1)[0] if f'{name}="' in labels \
            else ""

    for line in metrics.splitlines():
        if not line.startswith("apiserver_flowcontrol_") or "{" not in line:
            continue
        name, rest = line.split("{", 1)
        labels, value = rest.rsplit("} ", 1)
        level = label(labels, "priority_level")
        if not level:
            continue
        entry = levels.setdefault(level, {"dispatched": 0, "rejected": 0, "waited": 0,
                                          "wait_s_sum": 0.0})
        v = float(value)
        if name == "apiserver_flowcontrol_dispatched_requests_total":
            entry["dispatched"] += int(v)
        elif name == "apiserver_flowcontrol_rejected_requests_total":
            entry["rejected"] += int(v)
        elif name == "apiserver_flowcontrol_request_wait_duration_seconds_count" and \
                label(labels, "execute") == "true":
            entry["waited"] += int(v)
        elif name == "apiserver_flowcontrol_request_wait_duration_seconds_sum" and \
                label(labels, "execute") == "true":
            entry["wait_s_sum"] += v
        elif name == "apiserver_flowcontrol_request_wait_duration_seconds_bucket" and \
                label(labels, "execute") == "true":
            le = float(label(labels, "le").replace("+Inf", "inf"))
            per = buckets.setdefault(level, {})
            per[le] = per.get(le, 0.0) + v
    out: dict[str, dict[str, Any]] = {}
    for level, entry in levels.items():
        if not (entry["dispatched"] or entry["rejected"]):
            continue
        waited = entry.pop("waited")
        total = entry.pop("wait_s_sum")
        entry["wait_mean_s"] = round(total / waited, 4) if waited else None
        per = sorted(buckets.get(level, {}).items())
        entry["wait_p99_at_most_s"] = next(
            (le for le, count in per if waited and count >= 0.99 * waited), None)
        out[level] = entry
    return out


async def apiserver_metrics(server: ApiServer) -> str:
    connector = aiohttp.TCPConnector(ssl=False, limit=1)
    async with aiohttp.ClientSession(connector=connector) as session, session.get(
            f"{server.url}/metrics",
            headers={"Authorization": f"Bearer {server.admin_token}"}) as r:
        return await r.text()


async def apiserver_objects(session: aiohttp.ClientSession, world: World) -> dict[str, int]:
    """The management API server's ``apiserver_resource_objects`` (objects per resource
    in its storage, the ones with more than 100)."""
    server = world["mgmt"]
    async with session.get(f"{server.url}/metrics",
                           headers={"Authorization": f"Bearer {server.admin_token}"}) as r:
        text = await r.text()
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith(("apiserver_resource_objects{", "apiserver_storage_objects{")):
            labels, value = line.rsplit(" ", 1)
            res = labels.split('resource="', 1)[1].split('"', 1)[0]
            if float(value) > 100:
                out[res] = max(out.get(res, 0), int(float(value)))
    return out


async def settle_and_measure(world: World, sim: Sim, sampler: Sampler,
                             seconds: float) -> dict[str, Any]:
    """--setup-only: nothing more written; after ``seconds`` idle, each process's RSS
    (and peak), etcd's db size and the API server's object counts."""
    await asyncio.sleep(seconds)
    out: dict[str, Any] = {"idle_s": seconds, "loadavg": os.getloadavg()}
    for name, proc in sampler.pids.items():
        u = proc_usage(proc.pid) if proc is not None else None
        if u is not None:
            out[name] = {k: round(v, 1) for k, v in u.items()}
    connector = aiohttp.TCPConnector(ssl=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        out["etcd_db"] = await etcd_db_bytes(session, world)
        out["apiserver_objects"] = await apiserver_objects(session, world)
    du = await asyncio.to_thread(subprocess.run, ["du", "-sb", str(world.workdir / "etcd-data")],
                                 capture_output=True, text=True, check=False)
    if du.returncode == 0:
        out["etcd_data_dir_bytes"] = int(du.stdout.split()[0])
    return out


async def steady(r: Run, n: int) -> dict[str, Any]:
    args, session, controllers, audit = r.args, r.session, r.controllers, r.audit
    deadline = time.monotonic() + args.timeout
    doc: dict[str, Any] | None = None
    leader: Controller | None = None
    while not complete(doc, n):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no complete status within {args.timeout} s: "
                               f"{(doc or {}).get('summary')}")
        check_exits(r)
        t0 = time.monotonic()
        leader, doc = await leader_status(session, controllers)
        # Poll at most a fifth of the time: /status is served by the controller's loop.
        await asyncio.sleep(max(0.2, 4 * (time.monotonic() - t0)))
    assert leader is not None
    first_complete = time.monotonic() - leader.started
    at_first = leader.usage()
    claimed: float | None = None
    if args.replicas > 1 and args.shards:
        # Sharded: every shard claimed by a live replica before anything is measured
        # (a newcomer waits one lease for the shards nobody held before).
        while True:
            check_exits(r)
            holders = await shard_holders(r.mgmt, args.shards)
            alive = {c.identity for c in controllers if c.alive()}
            if len(holders) == args.shards and set(holders.values()) <= alive:
                claimed = time.monotonic() - min(c.started for c in controllers)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"shards not all claimed within {args.timeout} s")
            await asyncio.sleep(1.0)
    events: list[dict[str, Any]] = []
    last_write = await wait_quiet(audit, events, args.quiet_seconds, deadline)
    settled = leader.usage()
    # Idle: nothing changes anywhere; what does the controller spend?
    t0, u0 = time.monotonic(), leader.usage()
    s0 = proc_usage(r.sim.proc.pid)
    latencies = await probe_latency(session, leader, args.idle_seconds)
    window = time.monotonic() - t0
    u1 = leader.usage()
    s1 = proc_usage(r.sim.proc.pid)
    sim_stats = await r.sim.admin(session, "/kubesim/stats")
    sim_idle = {  # kubesim with the replicas connected, over the same idle window
        "rss_mib": round(s1["rss_mib"], 1), "peak_rss_mib": round(s1["peak_rss_mib"], 1),
        "idle_cpu_s_per_min": round((s1["cpu_s"] - s0["cpu_s"]) / window * 60, 3),
        **{k: sim_stats[k] for k in ("connections", "watches", *WATCH_DELIVERY)
           if k in sim_stats},
    } if s0 is not None and s1 is not None else None
    events.extend(audit.read())
    replicas = {c.identity: {k: round(v, 2) for k, v in c.usage().items()}
                for c in controllers} if len(controllers) > 1 else None
    writes = [e for e in events if is_write(e)]
    idle_writes = [e for e in writes if audit_time(e) >= time.time() - window]
    return {
        "leader": leader.identity,
        "steady": {
            "start_to_first_complete_status_s": round(first_complete, 2),
            **({"start_to_every_shard_claimed_s": round(claimed, 1)} if claimed else {}),
            "quiet_after_s": round(last_write - leader.started_wall, 1)
            if last_write else None,
            "writes_after_start": len(writes),
            "lease_writes_after_start": sum(
                1 for e in events if e.get("verb") in WRITE_VERBS
                and (e.get("objectRef") or {}).get("resource") == "leases"),
            "write_profile": write_profile(events),
            "writes_by_kind": dict(Counter(describe(e) for e in writes).most_common()),
            "requests_after_start": dict(Counter(describe(e) for e in events).most_common()),
            "cpu_s_to_first_complete": round(at_first["cpu_s"], 2),
            "cpu_s_to_quiet": round(settled["cpu_s"], 2),
            "idle_window_s": round(window, 1),
            "idle_cpu_s_per_min": round((u1["cpu_s"] - u0["cpu_s"]) / window * 60, 3),
            "idle_writes": len(idle_writes),
            "rss_mib": round(u1["rss_mib"], 1),
            "peak_rss_mib": round(u1["peak_rss_mib"], 1),
            "healthz_round_trip_idle": ms(latencies),
            **({"replicas_at_idle_end": replicas} if replicas else {}),
            **({"kubesim_at_idle_end": sim_idle} if sim_idle else {}),
        },
    }


# kubesim's record of how late watches were sent their changes (changes sent > 5 s after
# they were made, the longest such wait, the oldest change not yet sent): a watch that
# goes silent with changes pending shows here (a rollout stalled 150 s on one, 2026-12-01).
WATCH_DELIVERY = ("late_events", "late_max_seconds", "pending_oldest_seconds")


async def rollout(r: Run, fleet: list[FleetCluster]) -> dict[str, Any]:
    args, session, mgmt, sim = r.args, r.session, r.mgmt, r.sim
    controllers, audit = r.controllers, r.audit
    out: dict[str, Any] = {"step_seconds": args.step_seconds}
    r.result["rollout"] = out  # filled in place: kept if a later phase stops the run
    alone = fleet[:max(1, min(args.one_by_one, len(fleet)))]
    audit.read()
    before = await sim.admin(session, "/kubesim/stats")
    u0 = {c.identity: c.usage()["cpu_s"] for c in controllers}
    stop = asyncio.Event()
    lat_task = asyncio.create_task(probe_latency(session, controllers[0], 1e9, stop))
    events: list[dict[str, Any]] = []
    took: list[float] = []
    for one in alone:  # each alone: the next bumped once the last is done and quiet
        await bump(mgmt, one, V2)
        took.append(await wait_rolled(r, {one.name}))
        await wait_quiet(audit, events, 3.0, time.monotonic() + args.timeout)
    after = await sim.admin(session, "/kubesim/stats")
    stop.set()
    latencies = await lat_task
    report = await sim.admin(session, "/kubesim/standin")
    # The node side's record, for a closer look at single gaps afterwards.
    (r.workdir / "standin.json").write_text(json.dumps(report))
    gaps: list[float] = []
    done_nodes = 0
    wl: Counter[str] = Counter()
    for one in alone:
        seen = [(row[1], row[3]) for row in report["seen"] if row[0] == one.name]
        done = [(row[1], row[3]) for row in report["completed"] if row[0] == one.name]
        gaps += completion_gaps(seen, done)
        done_nodes += len(done)
        wl += sim_requests(after, one.name) - sim_requests(before, one.name)
    mg = Counter(describe(e) for e in events)
    out["one_cluster"] = {
        "cluster": alone[0].name, "roll_s": round(took[0], 2),
        **({"clusters_one_by_one": len(alone), "roll_s_each": [round(t, 2) for t in took]}
           if len(alone) > 1 else {}),
        "nodes_upgraded": done_nodes,
        "healthz_round_trip": ms(latencies),
        "completion_to_next_request": ms(gaps),
        "api_requests_per_node_upgrade": round((sum(mg.values()) + sum(wl.values()))
                                               / max(1, done_nodes), 2),
        "management_requests": dict(mg.most_common()),
        "workload_requests": dict(wl.most_common()),
        "controller_cpu_s": {c.identity: round(c.usage()["cpu_s"] - u0[c.identity], 2)
                             for c in controllers},
    }
    if args.rollout_all and len(fleet) > 1:
        out["all_clusters"] = await rollout_all(r, fleet)
    return out


async def rollout_all(r: Run, fleet: list[FleetCluster]) -> dict[str, Any]:
    """Every other cluster to V2 by one fleet-wide FleetUpgrade (no selector), as an
    operator asks for it; with --kill-one a replica is SIGKILLed mid-rollout. Then the
    node side's record is checked (fleet.testing.rollcheck) for double dispatch and
    budget, quorum, concurrency and wave-order breaches."""
    args = r.args
    nodes_per = CONTROL_PLANES + WORKERS
    rest = {fc.name for fc in fleet[max(1, args.one_by_one):]}
    u0 = {c.identity: c.usage()["cpu_s"] for c in r.controllers}
    t0 = time.monotonic()
    bump_wall = time.time()
    await r.mgmt.create(FLEET_UPGRADES, {
        "apiVersion": FLEET_UPGRADES.api_version, "kind": FLEET_UPGRADES.kind,
        "metadata": {"name": "to-all", "namespace": NAMESPACE},
        "spec": {"version": V2}}, NAMESPACE)
    killer = asyncio.create_task(kill_mid_rollout(r, rest)) if args.kill_one else None
    try:
        took_all = await wait_rolled(r, rest)
    finally:
        if killer is not None and not killer.done():
            killer.cancel()
    out: dict[str, Any] = {
        "clusters": len(rest), "nodes": len(rest) * nodes_per,
        "max_concurrent_clusters": args.max_concurrent_clusters,
        "waves": [w["name"] for w in waves_config(args)] + ["default"],
        "roll_all_s": round(time.monotonic() - t0, 1),
        "roll_after_bumps_s": round(took_all, 1),
        "controller_cpu_s": {c.identity: round(c.usage()["cpu_s"] - u0[c.identity], 2)
                             for c in r.controllers if c.alive()},
        "rss_mib_at_end": {c.identity: round(c.usage()["rss_mib"], 1)
                           for c in r.controllers if c.alive()},
    }
    sim_stats = await r.sim.admin(r.session, "/kubesim/stats")
    out["kubesim_watch_delivery"] = {k: sim_stats[k] for k in WATCH_DELIVERY if k in sim_stats}
    report = await r.sim.admin(r.session, "/kubesim/standin")
    # Kept for a closer look (which cluster waited, when each node was asked / done).
    await asyncio.to_thread((r.workdir / "standin-report.json").write_text,
                            json.dumps(report))
    runs = node_runs(report, rest, since=bump_wall)
    n = len(fleet)
    topo = Topology(
        waves=[*(w["name"] for w in waves_config(args)), "default"],
        wave_of={fc.name: wave_of(i, n) if args.waves else "default"
                 for i, fc in enumerate(fleet) if fc.name in rest},
        nodes={c: node_names(c) for c in rest}, max_unavailable=1,
        max_concurrent=dict.fromkeys(("canary", "early", "default"),
                                     args.max_concurrent_clusters))
    signals = {(c, node): count for c, node, count in report.get("multi_signal") or []}
    verdict = check(runs, signals, topo)
    out["check"] = verdict.summary()
    out["check"]["requests_seen"] = len(runs)
    out["check"]["standin_failures"] = report.get("failures")
    if killer is not None:
        kill = killer.result() if killer.done() and not killer.cancelled() else None
        if kill is None:
            out["kill"] = {"killed": None, "why": "no replica held a cluster mid-rollout "
                           "before the rollout ended"}
        else:
            waits = handoffs(runs, kill.pop("victim_clusters"), kill["killed_at"])
            kill["resumed_clusters"] = len(waits)
            kill["handoff_s"] = {
                "min": min((h.waited_s for h in waits), default=None),
                "median": round(percentile([h.waited_s for h in waits], 0.5), 2)
                if waits else None,
                "max": max((h.waited_s for h in waits), default=None)}
            kill["lease_seconds"] = args.lease_seconds
            # per cluster: waited, and its next request after the kill (s)
            kill["handoffs"] = {h.cluster: [h.waited_s, round(h.next_request - kill[
                "killed_at"], 3)] for h in waits}
            out["kill"] = kill
    return out


def node_runs(report: dict[str, Any], clusters: set[str], since: float) -> list[NodeRun]:
    """The stand-in's record of the requests seen after ``since`` in ``clusters``."""
    completed = {(c, n, p): t for c, n, p, t in report["completed"]}
    return [NodeRun(c, n, p, t, completed.get((c, n, p)))
            for c, n, p, t in report["seen"] if c in clusters and t >= since]


async def shard_holders(mgmt: KubeClient, shards: int) -> dict[int, str]:
    leases = (await mgmt.list(LEASES, NAMESPACE,
                              label_selector=f"{GROUP_LABEL}={LEASE_GROUP}")).items
    names = {shard_lease_name(LEASE_GROUP, s): s for s in range(shards)}
    return {names[x["metadata"]["name"]]: x["spec"].get("holderIdentity") or ""
            for x in leases if x["metadata"]["name"] in names}


async def kill_mid_rollout(r: Run, clusters: set[str]) -> dict[str, Any]:
    """Once ``--kill-after`` of ``clusters`` are done: SIGKILL the replica holding the
    most clusters that are mid-rollout (a node asked, another not yet), nothing released.
    Then wait until none of its shards is held by it any more."""
    args = r.args
    nodes_per = CONTROL_PLANES + WORKERS
    while True:
        t_poll = time.monotonic()
        report = await r.sim.admin(r.session, "/kubesim/standin")
        asked = Counter(row[0] for row in report["seen"] if row[0] in clusters)
        done = Counter(row[0] for row in report["completed"] if row[0] in clusters)
        finished = sum(1 for v in done.values() if v >= nodes_per)
        mid = {c for c, k in asked.items() if 0 < k < nodes_per}
        if finished >= args.kill_after * len(clusters) and mid:
            holders = await shard_holders(r.mgmt, args.shards)
            owner = {c: holders.get(shard_of((NAMESPACE, c), args.shards), "")
                     for c in clusters}
            alive = {c.identity: c for c in r.controllers if c.alive()}
            votes = Counter(owner[c] for c in mid if owner[c] in alive)
            if votes:
                victim = alive[votes.most_common(1)[0][0]]
                os.killpg(victim.proc.pid, signal.SIGKILL)  # nothing released
                killed_at = time.time()
                r.killed.add(victim.identity)
                r.result["kill_so_far"] = {"killed": victim.identity, "killed_at": killed_at,
                                           "at_clusters_done": finished}
                victim.proc.wait()
                theirs = [s for s, h in holders.items() if h == victim.identity]
                while True:  # its shard claims taken by the others
                    now = await shard_holders(r.mgmt, args.shards)
                    if all(now.get(s, "") not in ("", victim.identity) for s in theirs):
                        break
                    await asyncio.sleep(0.5)
                return {"killed": victim.identity, "killed_at": killed_at,
                        "at_clusters_done": finished, "mid_rollout_at_kill": votes[
                            victim.identity], "shards": len(theirs),
                        "victim_clusters": [c for c in clusters
                                            if owner[c] == victim.identity],
                        "shards_taken_s": round(time.time() - killed_at, 2)}
        await asyncio.sleep(max(1.0, 4 * (time.monotonic() - t_poll)))


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=10, help="CAPI clusters (3 + 7 nodes each)")
    p.add_argument("--replicas", type=int, default=1,
                   help="controller processes (1: no leader election; more: with Leases)")
    p.add_argument("--lease-seconds", type=int, default=15,
                   help="with --replicas > 1: the controllers' Lease duration")
    p.add_argument("--shards", type=int, default=None,
                   help="with --replicas > 1: shards of the fleet (default 8 per replica; "
                   "0: one leader, the others stand by)")
    p.add_argument("--waves", action="store_true",
                   help="waves canary (1 %% of the clusters), early (9 %%), default (rest)")
    p.add_argument("--kill-one", action="store_true",
                   help="with --rollout-all and sharded replicas: SIGKILL the replica "
                   "holding the most clusters mid-rollout, once --kill-after of them are done")
    p.add_argument("--kill-after", type=float, default=0.3,
                   help="fraction of the clusters rolled before --kill-one kills")
    p.add_argument("--stagger-seconds", type=float, default=0.0,
                   help="start the replicas this far apart (default: all at once)")
    p.add_argument("--create-concurrency", type=int, default=8,
                   help="clusters written to the management cluster at once")
    p.add_argument("--setup-only", action="store_true",
                   help="set up the management side and kubesim only (no controller): "
                   "their RSS, etcd's db size, set-up time and load after --idle-seconds")
    p.add_argument("--apf", choices=("off", "builtin", "chart"), default="off",
                   help="off: controllers in system:masters, APF off (default); builtin: "
                        "APF on, controllers as the chart's ServiceAccount identity "
                        "(not exempt), the built-in FlowSchemas only; chart: also the "
                        "chart's Lease FlowSchema + PriorityLevelConfiguration (helm)")
    p.add_argument("--apiserver-arg", action="append", default=[], metavar="FLAG",
                   help="one more flag for the management kube-apiserver (repeatable; "
                   "e.g. --apiserver-arg=--watch-cache=false)")
    p.add_argument("--apiserver-env", action="append", default=[], metavar="KEY=VALUE",
                   type=env_pair, help="environment for the management kube-apiserver "
                   "only (repeatable; e.g. GOGC=50, GOMEMLIMIT=1GiB)")
    p.add_argument("--rollout", action="store_true",
                   help="also roll one cluster to a new version while the others idle")
    p.add_argument("--one-by-one", type=int, default=1, metavar="K",
                   help="with --rollout: roll K clusters one after the other, each alone "
                   "(9 completion -> next request samples per cluster)")
    p.add_argument("--rollout-all", action="store_true",
                   help="with --rollout: then roll every other cluster too")
    p.add_argument("--max-concurrent-clusters", type=int, default=1,
                   help="the fleet config's rollout.maxConcurrentClusters")
    p.add_argument("--idle-seconds", type=float, default=60.0,
                   help="idle window measured after the controller settles")
    p.add_argument("--quiet-seconds", type=float, default=15.0,
                   help="settled = no controller write for this long")
    p.add_argument("--step-seconds", type=float, default=0.1,
                   help="node agent stand-in: time per protocol step (7 steps)")
    p.add_argument("--timeout", type=float, default=1800.0, help="deadline for each phase")
    p.add_argument("--controller-arg", action="append", default=[], metavar="FLAG",
                   help="one more argument for every `k0s-fleet controller` (repeat), e.g. "
                        "--controller-arg=--write-qps=0")
    p.add_argument("--controller-log-level", default="WARNING",
                   help="the controllers' --log-level (INFO: start-up milestones, "
                        "timestamped, in controller-*.log of the workdir; DEBUG logs every "
                        "pass and perturbs)")
    p.add_argument("--workdir", help="keep logs here (default: a new temporary directory)")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    if args.clusters < 1 or args.replicas < 1:
        p.error("--clusters and --replicas must be at least 1")
    if args.shards is None:
        args.shards = 8 * args.replicas if args.replicas > 1 else 0
    if args.kill_one and not (args.rollout_all and args.replicas > 1 and args.shards):
        p.error("--kill-one needs --rollout --rollout-all and sharded replicas (--replicas > 1)")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="k0s-fleet-scale-"))
    # SIGTERM as Ctrl-C: the run is cancelled and its finally stops the controllers,
    # kubesim and the test world (the default action would leave them running).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    result: dict[str, Any] = {}
    try:
        asyncio.run(run(args, workdir, result))
    except BaseException as e:  # the phases measured so far are kept, with why it stopped
        result["stopped"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        text = json.dumps(result, indent=2)
        if args.json:
            Path(args.json).write_text(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
