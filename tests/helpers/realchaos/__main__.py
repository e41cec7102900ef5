"""``python -m tests.helpers.realchaos``: run seeded real-world chaos trials one after
another (``make chaos-real``); a failing trial prints its seed and the replay command and
keeps its logs."""

from __future__ import annotations

import argparse
import logging
import signal
import time
from collections import Counter

import anyio

from tests.helpers.realchaos.schedule import FAULT_KINDS
from tests.helpers.realchaos.trial import TrialResult, run_trial


def summary(results: list[TrialResult], seconds: float) -> str:
    faults: Counter[str] = Counter(dict.fromkeys(FAULT_KINDS, 0))
    conflicts: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
        conflicts.update(r.conflicts)
    bad = [r for r in results if not r.ok]
    lines = [f"{len(results)} real trials in {seconds:.0f}s, {len(bad)} with violations; "
             f"{sum(r.steps for r in results)} node steps, "
             f"{sum(r.events for r in results)} events checked, operator retries "
             f"{sum(r.retries for r in results)}",
             "faults injected: " + ", ".join(f"{k} {v}" for k, v in faults.items()),
             "409 conflicts provoked (by user): " + ", ".join(
                 f"{k} {v}" for k, v in sorted(conflicts.items()))]
    lines += [f"FAILED seed {r.seed} (replay: {r.replay}; logs {r.workdir}): "
              + " | ".join(v.splitlines()[0] for v in r.violations[:3]) for r in bad]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.helpers.realchaos",
                                description="Seeded chaos trials on the real test world.")
    p.add_argument("--seeds", type=int, default=20, help="how many trials")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--seed", type=int, help="replay one trial (its logs are kept)")
    p.add_argument("--small", action="store_true", help="the CI slice's fleet sizes")
    p.add_argument("--faults", type=int, help="faults per trial (default: 5-8 by seed; "
                   f"{len(FAULT_KINDS)} = every kind once)")
    args = p.parse_args(argv)
    # The trial's own watches retry through every outage it causes: not news.
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s")
    seeds = [args.seed] if args.seed is not None else list(
        range(args.first_seed, args.first_seed + args.seeds))
    results: list[TrialResult] = []
    t0 = time.monotonic()
    stop: list[int] = []

    def on_interrupt(signum: int, _frame: object) -> None:
        print(f"signal {signum}: stopping after this trial (its processes are cleaned up)",
              flush=True)
        stop.append(signum)

    signal.signal(signal.SIGINT, on_interrupt)
    signal.signal(signal.SIGTERM, on_interrupt)
    for seed in seeds:
        if stop:
            break
        r = anyio.run(lambda s=seed: run_trial(  # type: ignore[misc]
            s, small=args.small, faults=args.faults,
            keep=True if args.seed is not None else None))
        print(r.report(), flush=True)
        results.append(r)
    print(summary(results, time.monotonic() - t0))
    return 1 if any(not r.ok for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
