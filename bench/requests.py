"""API requests per node upgrade, counted by the API servers (audit log).

    .venv/bin/python bench/requests.py [--runs 3] [--control-planes 1] [--workers 6]
                                       [--max-unavailable 2] [--json out.json]
                                       [--no-policy | --no-record-watch]

Each run stands up its own test world (etcd, a management and a workload
kube-apiserver, both auditing every request), one CAPI cluster whose nodes are
SimNodes running the real agent, and the controller (with the fleet rollout policy, its
record kept from a watch, as `k0s-fleet controller` runs it; --no-policy: the bare
FleetController, --no-record-watch: the record read with a GET per pass); it rolls the
cluster to a new version and counts every request of the controller (both clusters) and
of the agents between the version bump and the end of the rollout
(tests/helpers/upgradecost.py has the exact window). Printed per run: requests per node
upgrade by who, verb and resource.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.upgradecost import (  # noqa: E402
    AGENT_USER,
    CONTROLLER_USER,
    measure_rollout,
)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for i in range(args.runs):
        cost = await measure_rollout(control_planes=args.control_planes, workers=args.workers,
                                     max_unavailable=args.max_unavailable,
                                     policy=args.policy, record_watch=args.record_watch)
        summary = cost.summary()
        print(f"run {i + 1}: {json.dumps(summary, indent=1)}", flush=True)
        runs.append({"summary": summary, "controller": cost.per_node(CONTROLLER_USER),
                     "agent": cost.per_node(AGENT_USER)})
    out = {"runs": runs, **{
        who: {"mean": round(statistics.mean(r[who] for r in runs), 2),
              "max": round(max(r[who] for r in runs), 2)}
        for who in ("controller", "agent")}}
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--control-planes", type=int, default=1)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--max-unavailable", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-policy", dest="policy", action="store_false")
    parser.add_argument("--no-record-watch", dest="record_watch", action="store_false")
    a = parser.parse_args()
    result = anyio.run(main, a)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
