"""Serve kubesim as a process (benchmarks): ``python -m fleet.testing.kubesim --help``.

The admin token is read from ``$KUBESIM_TOKEN`` (never from the command line, which
``ps`` shows). Once serving, ``<workdir>/ready.json`` holds ``{"port": ..., "ca": ...}``.
Seed file: ``{"clusters": [{"name": "c1", "nodes": [{"name": "c1-cp-0",
"version": "v1.31.2+k0s.0", "controlPlane": true}, ...]}]}``. SIGTERM/SIGINT stop it.
With ``$KUBESIM_TRACEMALLOC`` set, allocations are traced and each SIGUSR1 writes the
largest allocation sites to ``<workdir>/tracemalloc-<n>.txt`` (memory diagnosis).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from typing import Any

from fleet.testing.kubesim.certs import make_serving_cert
from fleet.testing.kubesim.nodes import realistic_node
from fleet.testing.kubesim.server import KubeSim, write_json
from fleet.testing.kubesim.store import KINDS

NODES = KINDS[("", "v1", "nodes")]


class SeedError(ValueError):
    pass


def seed(sim: KubeSim, spec: Any) -> int:
    """Create the seed file's clusters and Nodes; the number of Nodes."""
    if not isinstance(spec, dict) or not isinstance(spec.get("clusters"), list):
        raise SeedError("seed file: expected {\"clusters\": [...]}")
    count = 0
    for i, c in enumerate(spec["clusters"]):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise SeedError(f"seed file: clusters[{i}] needs a string 'name'")
        store = sim.add_cluster(c["name"])
        for j, n in enumerate(c.get("nodes") or []):
            try:
                node = realistic_node(str(n["name"]), str(n["version"]),
                                      control_plane=bool(n.get("controlPlane")), index=count)
            except (KeyError, TypeError, ValueError) as e:
                raise SeedError(f"seed file: clusters[{i}].nodes[{j}]: {e!r}") from None
            store.create(NODES, "", node)
            count += 1
    return count


async def serve(args: argparse.Namespace, token: str, spec: list[Any]) -> None:
    """``spec``: the seed file's content, if any, in a list that this empties (the
    decoded seed would otherwise stay alive as long as the server: ~14 KB per cluster)."""
    workdir = Path(args.workdir)
    sim = KubeSim(token=token, cert=make_serving_cert(workdir / "certs"), port=args.port,
                  history=args.history, bookmark_seconds=args.bookmark_seconds)
    nodes = seed(sim, spec.pop()) if spec else 0
    if args.standin:
        sim.play_node_agents(args.step_seconds)
    await sim.start()
    write_json(workdir / "ready.json", {"port": sim.port, "ca": str(sim.cert.ca),
                                        "clusters": len(sim.clusters), "nodes": nodes,
                                        "pid": os.getpid()})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    if tracemalloc.is_tracing():
        dumps = [0]

        def dump() -> None:
            dumps[0] += 1
            stats = tracemalloc.take_snapshot().statistics("lineno")
            lines = [f"total {sum(st.size for st in stats)} B in {len(stats)} sites"]
            lines += [str(st) for st in stats[:60]]
            (workdir / f"tracemalloc-{dumps[0]}.txt").write_text("\n".join(lines) + "\n")

        loop.add_signal_handler(signal.SIGUSR1, dump)
    await stop.wait()
    await sim.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleet.testing.kubesim",
                                description="stand-in workload API servers (tests/benchmarks)")
    p.add_argument("--workdir", required=True, help="certificates and ready.json go here")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", help="JSON file of clusters and Nodes to create at start")
    p.add_argument("--standin", action="store_true",
                   help="answer node requests in place of node agents")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="stand-in agent: time per protocol step")
    p.add_argument("--history", type=int, default=2000,
                   help="changes kept per cluster for resuming watches")
    p.add_argument("--bookmark-seconds", type=float, default=60.0)
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.environ.get("KUBESIM_TRACEMALLOC"):
        tracemalloc.start()
    token = os.environ.get("KUBESIM_TOKEN")
    if not token:
        print("kubesim: set $KUBESIM_TOKEN to the admin bearer token", file=sys.stderr)
        return 2
    try:
        spec = [json.loads(Path(args.seed).read_text())] if args.seed else []
    except (OSError, ValueError) as e:
        print(f"kubesim: seed file {args.seed}: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args, token, spec))
    except SeedError as e:
        print(f"kubesim: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
