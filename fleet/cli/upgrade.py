"""``k0s-fleet upgrade VERSION``: ask the fleet for a k0s version, and follow it.

Creates (or updates) one ``FleetUpgrade`` in the controller's namespace
(``-n/--namespace``, else ``management.namespace``): "this fleet, or the clusters matching
``--selector``, go to VERSION". The controller does the rest as the fleet YAML's rollout
policy allows (waves, windows, budgets) and writes the FleetUpgrade's status, which this
command prints until it is ``Complete`` (exit 0) or ``Failed`` (exit 1: failed nodes, or
k0s's version skew policy refuses a cluster), selects no cluster of the fleet (exit 1, at
once), or ``--timeout`` passes (exit 3). While it waits it prints a line whenever the status
changes and at least every 30 seconds (the same line with the time waited), so a long soak
does not look hung.
``--no-wait`` returns once the object is written.

Before writing, it checks that a controller runs in that namespace (its rollout ConfigMap
``k0s-fleet-rollout``, or one of its Leases ``k0s-fleet-*``): without one, nothing would
ever read the FleetUpgrade, so it exits 2 naming the namespace (``--force`` writes anyway).
Bad input (a version, a selector, a duration, a kubeconfig) exits 2.

``--dry-run`` writes nothing: after the same checks it prints the plan as if the
FleetUpgrade had been written (``k0s-fleet plan --version``: waves, clusters, node order,
each object's executor, every refusal of k0s's version skew policy and each cluster's
ladder), judged by the fleet YAML the controller runs with; it exits 1 when a cluster
would be refused or none is selected.

On a terminal (text output) the wait is a live view redrawn in place: per wave and cluster
the phase, the current step and its node, the time in it and an ETA from the node upgrades
seen so far (:mod:`fleet.cli.progress`). Not on a terminal, the lines above, and with each
of them the clusters' lines of that view.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.cli import common, plan
from fleet.cli.common import default_name, upgrade_object
from fleet.cli.exit import Exit
from fleet.cli.progress import progress_state, render_progress
from fleet.config.schedule import DurationError, parse_duration
from fleet.contract.selectors import LabelSelector, parse_label_selector
from fleet.contract.versions import InvalidVersionError, normalize
from fleet.kube import AlreadyExistsError, KubeClient, KubeError
from fleet.kube.resources import CONFIGMAPS, FLEET_UPGRADES, LEASES, NODE_PLANS
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP
from fleet.world.model import NodePlanInfo, nodeplan_from


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    common.add_output_argument(p, wide=True)
    p.add_argument("version", help="k0s version, e.g. v1.31.3+k0s.0")
    p.add_argument("--dry-run", action="store_true",
                   help="write nothing: show the plan as if the FleetUpgrade were written "
                        "(waves, clusters, node order, executors, ladders, every refusal; "
                        "exit 1 when a cluster would be refused or none is selected)")
    p.add_argument("--name", help="FleetUpgrade name (default: upgrade-<version>)")
    p.add_argument("-l", "--selector", default="",
                   help="only clusters with these labels, e.g. 'k0s-fleet.io/ring=canary' "
                        "(default: the whole fleet)")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="write the FleetUpgrade and return")
    p.add_argument("--timeout", default="6h", help="how long to follow, e.g. 90m")
    p.add_argument("--force", action="store_true",
                   help="write the FleetUpgrade even if no controller runs in the namespace")

HEARTBEAT_SECONDS = 30.0
CONTROLLER_LEASE_PREFIX = "k0s-fleet"


async def controller_present(mgmt: KubeClient, namespace: str) -> bool:
    """Whether a k0s-fleet controller marks ``namespace`` as its own: its rollout ConfigMap,
    or one of its Leases."""
    if await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace) is not None:
        return True
    leases = (await mgmt.list(LEASES, namespace)).items
    return any(str((lease.get("metadata") or {}).get("name", "")).startswith(
        CONTROLLER_LEASE_PREFIX) for lease in leases)


def no_controller_message(namespace: str) -> str:
    return (f"no k0s-fleet controller in namespace {namespace!r} (no ConfigMap "
            f"{ROLLOUT_CONFIGMAP}, no k0s-fleet Lease): nothing would read the FleetUpgrade. "
            "Choose the controller's namespace with -n/--namespace (or management.namespace "
            "in the fleet YAML), or pass --force to write it anyway")


def progress_line(obj: dict[str, Any]) -> str:
    st = obj.get("status") or {}
    waves = ", ".join(f"{w['name']} {w.get('phase', '?')} {w.get('complete', 0)}/"
                      f"{w.get('clusters', 0)}" for w in st.get("waves") or [])
    return (f"{st.get('phase') or 'Pending'}: {st.get('summary') or '-'} clusters, "
            f"{st.get('nodesUpToDate', 0)}/{st.get('nodesTotal', 0)} nodes"
            + (f" [{waves}]" if waves else "") + (f" - {st['message']}" if st.get("message")
                                                    else ""))


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 \
        else f"{s // 60}m{s % 60:02d}s"


@dataclass
class Printer:
    """What ``follow`` prints: a line (text) or document (json/yaml) when the status
    changes, and at least every ``heartbeat`` seconds a reminder that it is still waiting
    (text: the same line with the time waited, on stdout; json/yaml: on stderr, so the
    documents stay parseable)."""

    output: str = "text"
    heartbeat: float = HEARTBEAT_SECONDS
    started: float = 0.0
    _last: str = ""
    _printed_at: float | None = field(default=None, repr=False)

    def render(self, obj: dict[str, Any]) -> str:
        st = obj.get("status") or {}
        if self.output == "json":
            return json.dumps(st, sort_keys=True) + "\n"
        if self.output == "yaml":
            return "---\n" + common.dump(st, "yaml")
        return progress_line(obj) + "\n"

    def update(self, obj: dict[str, Any], now: float) -> tuple[str, str]:
        """(for stdout, for stderr) at time ``now``; either may be empty."""
        text = self.render(obj)
        if text != self._last:
            self._last, self._printed_at = text, now
            return text, ""
        if self._printed_at is not None and now - self._printed_at >= self.heartbeat:
            self._printed_at = now
            waited = _elapsed(now - self.started)
            if self.output == "text":
                return f"{text.rstrip()} (still waiting, {waited})\n", ""
            return "", (f"k0s-fleet upgrade: still waiting ({waited}): "
                        f"{progress_line(obj)}\n")
        return "", ""

    def waiting(self, now: float) -> str:
        """For stderr, at most every ``heartbeat`` seconds, while the controller has not
        yet observed the FleetUpgrade's generation."""
        if self._printed_at is None:
            self._printed_at = now
        elif now - self._printed_at >= self.heartbeat:
            self._printed_at = now
            return ("k0s-fleet upgrade: still waiting for the controller to pick up the "
                    f"FleetUpgrade ({_elapsed(now - self.started)})\n")
        return ""


def redraw_text(previous: int, lines: list[str]) -> str:
    """What redraws a view of ``previous`` lines in place with ``lines``: the cursor to
    the first line of the old view, the screen cleared from there, the new view."""
    back = f"\x1b[{previous}F\x1b[J" if previous else ""
    return back + "".join(f"{line}\n" for line in lines)


@dataclass
class LiveView:
    """The live progress view while ``follow`` waits: the FleetUpgrade's status and the
    NodePlans of its clusters (re-listed at most every ``refresh`` seconds), rendered by
    :func:`fleet.cli.progress.render_progress`. ``tty``: redrawn in place; otherwise the
    clusters' lines follow each progress line."""

    tty: bool
    width: int = 100
    refresh: float = 2.0
    _drawn: int = 0
    _nodeplans: list[NodePlanInfo] = field(default_factory=list)
    _listed_at: float | None = None

    async def _list_nodeplans(self, mgmt: KubeClient, obj: dict[str, Any]) -> None:
        clusters = {(str(c.get("namespace")), str(c.get("name")))
                    for c in (obj.get("status") or {}).get("clusters") or []}
        plans: list[NodePlanInfo] = []
        try:
            for ns in sorted({ns for ns, _ in clusters}):
                plans += [p for p in map(nodeplan_from, (await mgmt.list(NODE_PLANS, ns)).items)
                          if (ns, p.cluster) in clusters]
        except KubeError:
            return  # not readable with these rights: the view without steps
        self._nodeplans = plans

    async def lines(self, mgmt: KubeClient, obj: dict[str, Any], now: float) -> list[str]:
        if self._listed_at is None or now - self._listed_at >= self.refresh:
            self._listed_at = now
            await self._list_nodeplans(mgmt, obj)
        return render_progress(progress_state(obj, self._nodeplans, datetime.now(UTC)),
                               width=self.width)

    def draw(self, lines: list[str]) -> str:
        text = redraw_text(self._drawn, lines)
        self._drawn = len(lines)
        return text


def on_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def reason_of(obj: dict[str, Any], ctype: str) -> str | None:
    return next((c.get("reason") for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype), None)


def condition(obj: dict[str, Any], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


async def apply_upgrade(mgmt: KubeClient, *, namespace: str, name: str, version: str,
                        selector: dict[str, Any] | None) -> dict[str, Any]:
    """Create the FleetUpgrade, or move an existing one of that name to ``version``."""
    body = upgrade_object(name, namespace, version, selector)
    try:
        return await mgmt.create(FLEET_UPGRADES, body, namespace)
    except AlreadyExistsError:
        return await mgmt.patch(
            FLEET_UPGRADES, name, {"spec": {"version": version,
                                            "clusterSelector": selector or None}}, namespace)


async def follow(mgmt: KubeClient, *, namespace: str, name: str, generation: int,
                 out: Any = sys.stdout, as_json: bool = False, poll: float = 1.0,
                 output: str | None = None, heartbeat: float = HEARTBEAT_SECONDS,
                 live: LiveView | None = None) -> int:
    """Print the FleetUpgrade's progress until Complete (0) or Failed (1) (``output``: text,
    json or yaml; at least every ``heartbeat`` seconds a line, see :class:`Printer`; with
    ``live`` and text, the live progress view, :class:`LiveView`)."""
    printer = Printer(output or ("json" if as_json else "text"), heartbeat,
                      started=anyio.current_time())
    while True:
        obj = await mgmt.get(FLEET_UPGRADES, name, namespace)
        st = obj.get("status") or {}
        current = int(st.get("observedGeneration") or 0) >= generation
        if current:
            to_out, to_err = printer.update(obj, anyio.current_time())
            if live is not None and printer.output == "text" and (live.tty or to_out):
                lines = await live.lines(mgmt, obj, anyio.current_time())
                to_out = live.draw(lines) if live.tty \
                    else to_out + "".join(f"{line}\n" for line in lines[1:])
            if to_out:
                out.write(to_out)
                out.flush()
        else:
            to_err = printer.waiting(anyio.current_time())
        if to_err:
            sys.stderr.write(to_err)
            sys.stderr.flush()
        if current and condition(obj, "Complete"):
            return Exit.OK
        if current and condition(obj, "Failed"):
            return Exit.FAILED
        if current and reason_of(obj, "Complete") == "NoClusters":
            # Nothing would ever move: say so now instead of waiting out --timeout.
            print(f"k0s-fleet upgrade: FleetUpgrade {namespace}/{name} selects no cluster "
                  "of the fleet (check its clusterSelector and the fleet YAML's clusters)",
                  file=sys.stderr)
            return Exit.FAILED
        await anyio.sleep(poll)


async def _dry_run(args: argparse.Namespace) -> int:
    preview = plan.parse_preview(args.version, args.selector, args.name)
    async with common.fleet_session(args) as (mgmt, resolved):
        namespace = resolved.config.management.namespace
        if not args.force and not await controller_present(mgmt, namespace):
            raise common.BadInputError(no_controller_message(namespace))
        return await plan.show("upgrade", mgmt, resolved, output=args.output,
                               now=datetime.now(UTC), preview=preview)


async def _run(args: argparse.Namespace) -> int:
    if args.dry_run:
        return await _dry_run(args)
    version = normalize(args.version)
    try:
        selector: LabelSelector | None = parse_label_selector(args.selector) \
            if args.selector else None
    except ValueError as e:
        raise common.BadInputError(f"--selector: {e}") from None
    raw_selector = selector.model_dump(mode="json", by_alias=True, exclude_defaults=True) \
        if selector is not None else None
    try:
        timeout = parse_duration(args.timeout).total_seconds()
    except DurationError as e:
        raise common.BadInputError(f"--timeout: {e}") from None
    name = args.name or default_name(version)
    output = "text" if args.output == "wide" else args.output
    async with common.fleet_session(args, controller_config=False) as (mgmt, resolved):
        namespace = resolved.config.management.namespace
        if not args.force and not await controller_present(mgmt, namespace):
            raise common.BadInputError(no_controller_message(namespace))
        obj = await apply_upgrade(mgmt, namespace=namespace, name=name, version=version,
                                  selector=raw_selector)
        print(f"fleetupgrade.fleet.k0s-fleet.io/{name} in {namespace}: "
              f"{'clusters ' + args.selector if args.selector else 'the whole fleet'} -> "
              f"{version}", file=sys.stderr)
        if not args.wait:
            return Exit.OK
        with anyio.move_on_after(timeout):
            return await follow(mgmt, namespace=namespace, name=name,
                                generation=int(obj["metadata"].get("generation") or 1),
                                output=output,
                                live=LiveView(tty=on_terminal(sys.stdout),
                                              width=shutil.get_terminal_size().columns - 1))
        print(f"k0s-fleet upgrade: not complete after {args.timeout}", file=sys.stderr)
        return Exit.NOT_DONE


def run(args: argparse.Namespace) -> int:
    return common.run_command("upgrade", _run, args, bad_input=(InvalidVersionError,))
