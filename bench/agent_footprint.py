"""The node agent's footprint: start-up CPU, idle RSS, RSS during a large download, idle CPU.

Real agent processes (``python -m fleet.cli agent``) on simulated nodes
(``fleet.testing.simnode``) against a real etcd + kube-apiserver; releases from a loopback
release server. ``--before REPO`` runs the same measurements on another checkout's agent
(e.g. a worktree of an older commit) side by side, for before/after numbers.

    .venv/bin/python bench/agent_footprint.py [--before /path/to/old/checkout]
        [--starts 5] [--idle-rss-seconds 60] [--download-mib 100] [--idle-cpu-minutes 10]
        [--json out.json]

Definitions (all read from /proc of the agent process):
- start-up CPU: user+system CPU from exec until the agent logs that it is watching its
  Node (listed and watching); median of ``--starts`` fresh starts. The measured
  checkouts' ``fleet`` packages are byte-compiled first, as in the image.
- idle RSS: VmRSS after the agent has watched its (unchanged) Node for
  ``--idle-rss-seconds``.
- RSS during a download: VmRSS sampled every 50 ms while the signal says Downloading a
  ``--download-mib`` MiB release (max of the samples), and VmHWM (peak) after the upgrade.
- idle CPU: CPU seconds used over ``--idle-cpu-minutes`` of idling after that upgrade.
"""

from __future__ import annotations

import argparse
import compileall
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.contract.signal import SignalState
from fleet.kube import KubeClient
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
TERMINAL = {s for s in SignalState if s.terminal}


def proc_status(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def start_until_watching(node: SimNode) -> float:
    await node.start_agent()
    with anyio.fail_after(120):
        while not await node.agent_ready():
            await anyio.sleep(0.01)
    cpu = node.agent_cpu_seconds()
    assert cpu is not None
    return cpu


async def run_variant(  # noqa: PLR0917
        label: str, repo: Path, client: KubeClient, kubeconfig: dict[str, Any],
        rs: ReleaseServer, workdir: Path, args: argparse.Namespace, results: dict[str, Any],
        idle_gate: anyio.Event, idle_done: anyio.Event) -> None:
    out: dict[str, Any] = {"repo": str(repo)}
    results[label] = out
    async with SimNode.running(client, kubeconfig, workdir / label, rs.releases[V1],
                               start_agent=False) as node:
        node.agent_repo = repo
        # a busy 2-core machine can pause the loopback server longer than the test
        # default of 2 s; this bench measures memory, not stall handling
        node.agent_args = ["--download-stall-timeout", "60"]
        settings = repo / "fleet" / "agents" / "settings.py"
        if "allowed_url_prefixes" not in settings.read_text():
            node.url_prefixes = []  # an agent from before #29 has no --allowed-url-prefix
        starts = []
        for _ in range(args.starts):
            starts.append(await start_until_watching(node))
            await node.stop_agent()
        out["startup_cpu_seconds"] = starts
        out["startup_cpu_seconds_median"] = statistics.median(starts)

        await start_until_watching(node)
        assert node.agent is not None
        pid = node.agent.pid
        await anyio.sleep(args.idle_rss_seconds)  # the measurement window
        out["idle_rss_kib"] = proc_status(pid, "VmRSS")

        samples: list[int] = []
        plan = await node.request(rs.releases[V2])

        async def sample() -> None:
            while True:
                sig = node.signal()
                if sig is not None and sig.planId == plan and sig.status is not None \
                        and sig.status.status is SignalState.DOWNLOADING:
                    rss = proc_status(pid, "VmRSS")
                    if rss:
                        samples.append(rss)
                await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            sig = await node.wait_for(plan, TERMINAL, timeout=600)
            tg.cancel_scope.cancel()
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED, \
            sig.status.reason
        out["download_bytes"] = len(rs.releases[V2].body)
        out["download_rss_samples"] = len(samples)
        out["download_rss_kib_max"] = max(samples) if samples else None
        out["download_rss_kib_min"] = min(samples) if samples else None
        out["peak_rss_kib_after_upgrade"] = proc_status(pid, "VmHWM")
        out["rss_kib_after_upgrade"] = proc_status(pid, "VmRSS")

        idle_gate.set()
        cpu0 = node.agent_cpu_seconds()
        await anyio.sleep(args.idle_cpu_minutes * 60)  # the measurement window
        cpu1 = node.agent_cpu_seconds()
        assert cpu0 is not None and cpu1 is not None
        out["idle_cpu_seconds"] = round(cpu1 - cpu0, 3)
        out["idle_cpu_window_seconds"] = args.idle_cpu_minutes * 60
        out["rss_kib_after_idle"] = proc_status(pid, "VmRSS")
        idle_done.set()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    variants = {"after": REPO_ROOT}
    if args.before:
        variants = {"before": Path(args.before), **variants}
    for repo in variants.values():
        # As the image does (Dockerfile: compileall): start-up is measured with bytecode,
        # not with compiling every module from source.
        compileall.compile_dir(str(repo / "fleet"), quiet=1)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="k0s-fleet-bench-agent-") as tmp:
        work = Path(tmp)
        with World(["wl"], workdir=work / "world") as world:
            kubeconfig = world["wl"].kubeconfig()
            async with await world["wl"].client() as client, ReleaseServer() as rs:
                rs.add(V1)
                rs.add(V2, size=args.download_mib * 1024 * 1024)
                # Variants one after the other (start-up CPU is sensitive to a busy
                # machine), but their long idle windows overlap.
                async with anyio.create_task_group() as tg:
                    for label, repo in variants.items():
                        gate, done = anyio.Event(), anyio.Event()
                        tg.start_soon(run_variant, label, repo, client, kubeconfig, rs, work,
                                      args, results, gate, done)
                        await gate.wait()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--before", help="another checkout whose agent to measure as 'before'")
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--idle-rss-seconds", type=float, default=60)
    p.add_argument("--download-mib", type=int, default=100)
    p.add_argument("--idle-cpu-minutes", type=float, default=10)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.before:
        args.before = str(Path(args.before).resolve())
    results = anyio.run(main_async, args)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
