"""Where a sharded roll-all's management requests went, per rolled cluster.

Reads a ``bench/scale.py --rollout --rollout-all`` workdir after the run: the management
API server's audit log (every request of the controllers) and kubesim's stand-in record
(``standin-report.json``: when each node was asked and when it wrote Completed). The
window is the roll-all: from the first write of the burst that leads to the first
request of a cluster other than the one-cluster phase's (the harness waits for a quiet
management side first) to the end of the log (the writes after the last Completed are
the roll's too).

    .venv/bin/python bench/rollrate.py /tmp/rate/<name> [--json out.json]

Prints clusters rolled and per minute, the controllers' writes and reads per rolled
cluster by verb and resource, write latency, and a node's Completed -> the next node's
request in the same cluster (p50 / p90).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import (
    CONTROL_PLANES,
    WORKERS,
    audit_time,
    cluster_name,
    completion_gaps,
    describe,
    is_write,
    latency_s,
)

READ_VERBS = frozenset({"get", "list"})
QUIET_GAP = 2.0


def quantiles(values: list[float]) -> dict[str, float | int]:
    v = sorted(values)
    if not v:
        return {"n": 0}

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * len(v)))], 3)

    return {"n": len(v), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(v[-1], 3)}


def analyse(workdir: Path) -> dict[str, Any]:
    report = json.loads((workdir / "standin-report.json").read_text())
    first_phase = cluster_name(0)
    seen: dict[str, list[tuple[str, float]]] = defaultdict(list)
    done: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for c, n, _p, t in report["seen"]:
        if c != first_phase:
            seen[c].append((n, t))
    for c, n, _p, t in report["completed"]:
        if c != first_phase:
            done[c].append((n, t))
    nodes = CONTROL_PLANES + WORKERS
    first_request = min(t for rows in seen.values() for _n, t in rows)
    events = []
    with (workdir / "audit.log").open() as fh:
        for line in fh:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    # The roll-all's first write: walk back from its first request over writes less than
    # QUIET_GAP apart (the harness waits for a quiet management side before the bump).
    write_times = sorted(audit_time(e) for e in events if is_write(e))
    start = first_request
    for t in reversed([x for x in write_times if x <= first_request]):
        if start - t > QUIET_GAP:
            break
        start = t
    finished = {c: max(t for _n, t in rows) for c, rows in done.items()
                if len({n for n, _t in rows}) >= nodes}
    end = max(finished.values(), default=start)
    gaps: list[float] = []
    for c, rows in seen.items():
        gaps += completion_gaps(rows, done.get(c, []))
    writes: Counter[str] = Counter()
    reads: Counter[str] = Counter()
    lat: list[float] = []
    status_lat: list[float] = []
    log_end = start
    for ev in events:
        t = audit_time(ev)
        if t < start:
            continue
        log_end = max(log_end, t)
        if is_write(ev):
            writes[describe(ev)] += 1
            if (x := latency_s(ev)) is not None:
                lat.append(x)
                if (ev.get("objectRef") or {}).get("subresource") == "status":
                    status_lat.append(x)
        elif ev.get("verb") in READ_VERBS:
            reads[describe(ev)] += 1
    rolled = len(finished)
    per = max(rolled, 1)
    minutes = (end - start) / 60
    return {
        "clusters_rolled": rolled, "clusters_asked": len(seen),
        "roll_s": round(end - start, 1),
        "first_write_to_first_request_s": round(first_request - start, 2),
        "clusters_per_min": round(rolled / minutes, 2) if minutes else None,
        "log_after_last_completed_s": round(log_end - end, 1),
        "writes_total": sum(writes.values()),
        "writes_per_rolled_cluster": round(sum(writes.values()) / per, 2),
        "writes_by_kind_per_rolled_cluster": {
            k: round(v / per, 2) for k, v in writes.most_common()},
        "reads_total": sum(reads.values()),
        "reads_per_rolled_cluster": round(sum(reads.values()) / per, 2),
        "reads_by_kind_per_rolled_cluster": {
            k: round(v / per, 2) for k, v in reads.most_common()},
        "write_latency_s": quantiles(lat),
        "status_write_latency_s": quantiles(status_lat),
        "completed_to_next_request_s": quantiles(gaps),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdir", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    out = analyse(args.workdir)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
