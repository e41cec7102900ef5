"""The terminal view of the status document (rich): waves, clusters, progress bars,
nodes by state, halted objects with their reasons."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

_STATE_STYLE = {
    "UpToDate": "green", "Upgrading": "cyan", "Failed": "bold red", "Waiting": "white",
    "ClusterAPI": "magenta", "NotReady": "yellow", "Missing": "yellow",
}
_PHASE_STYLE = {
    "Complete": "green", "Progressing": "cyan", "Upgrading": "cyan", "Soaking": "blue",
    "Pending": "dim", "Queued": "dim", "Waiting": "yellow", "Halted": "bold red",
    "Failed": "bold red", "Paused": "yellow", "Stopped": "bold red", "Unreachable": "bold red",
}


def _phase(p: str) -> Text:
    return Text(p, style=_PHASE_STYLE.get(p, ""))


def _states(counts: dict[str, int]) -> Text:
    t = Text()
    for state, n in counts.items():
        if n:
            if t:
                t.append(" ")
            t.append(f"{state}:{n}", style=_STATE_STYLE.get(state, ""))
    return t or Text("-", style="dim")


WIDE_COLUMNS = (("executor", "executor"), ("step", "step"), ("node", "node"),
                ("inStep", "in step"))


_KEEP = frozenset({"step", "inStep"})  # short: never cut


def _cut(t: Text) -> Text:
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def _line(r: RenderableType) -> RenderableType:
    """``r`` on a line of its own (a ProgressBar ends none: what follows went on it)."""
    grid = Table.grid()
    grid.add_row(r)
    return grid


def render(doc: dict[str, Any], *, width: int = 30,
           wide: Mapping[str, Mapping[str, str]] | None = None) -> RenderableType:
    """The status document for a terminal; ``wide`` (``-o wide``: per ``namespace/name``
    the values of :data:`WIDE_COLUMNS`) adds those columns to each cluster's row.

    Wide rows stay one line each: long cells are cut with an ellipsis (the cluster's name
    never), the bar is shorter; ``-o json|yaml`` carry every value whole."""
    r, s = doc["rollout"], doc["summary"]
    head = Text.assemble(
        ("fleet rollout ", "bold"), _phase(r["phase"]),
        f"   {s['nodesUpToDate']}/{s['nodes']} nodes up to date, "
        f"{s['clustersComplete']}/{s['clusters']} clusters complete   ",
        ("at " + doc["generatedAt"], "dim"))
    parts: list[RenderableType] = [head, _line(ProgressBar(
        total=max(1, s["nodes"]), completed=s["nodesUpToDate"], width=60))]
    for key, label in (("emergencyStop", "EMERGENCY STOP"), ("halted", "HALTED"),
                       ("paused", "PAUSED")):
        if r[key]:
            parts.append(Text(f"{label}: {r[key]}", style="bold red" if key != "paused"
                              else "bold yellow"))
    if r["nextWakeup"]:
        parts.append(Text(f"next change expected at {r['nextWakeup']}", style="dim"))
    for w in doc["waves"]:
        if not w["clusters"]:
            continue
        title = Text.assemble((f"wave {w['name']}", "bold"), " ",
                              ("(canary) " if w["canary"] else ""), _phase(w["phase"]),
                              f"  {w['clustersComplete']}/{len(w['clusters'])} clusters, "
                              f"max {w['maxConcurrentClusters']} at once, soak {w['soak']}, "
                              f"failures {w['failedClusters']}/{w['toleratedFailures']}")
        table = Table(show_header=True, header_style="bold", expand=False, box=None)
        names = [f"{c['namespace']}/{c['name']}" for c in w["clusters"]]
        table.add_column("cluster", no_wrap=True, min_width=max(map(len, names)))
        table.add_column("phase", no_wrap=True)
        if wide is None:
            table.add_column("progress")
        table.add_column("nodes", justify="right", no_wrap=True)
        table.add_column("by state", min_width=len("by state"))
        if wide is not None:
            # short cells keep their width, the long ones give way (cut, never wrapped)
            for key, title_ in WIDE_COLUMNS:
                table.add_column(title_, no_wrap=key in _KEEP, min_width=len(title_))
            table.add_column("why not now", min_width=len("why not now"))
        else:
            table.add_column("why not now", overflow="fold", max_width=60)
        for c in w["clusters"]:
            extra = wide.get(f"{c['namespace']}/{c['name']}", {}) if wide is not None else {}
            why = Text(c["problem"] or c["reason"] or "", style="dim")
            phase = _phase("Unreachable" if c.get("unreachableSince") else c["phase"])
            nodes = f"{c['upToDate']}/{c['nodes']}"
            if wide is None:
                table.add_row(
                    f"{c['namespace']}/{c['name']}", phase,
                    ProgressBar(total=max(1, c["nodes"]), completed=c["upToDate"],
                                width=width),
                    nodes, _states(c["nodesByState"]), why)
                continue
            table.add_row(
                f"{c['namespace']}/{c['name']}", phase, nodes,
                _cut(_states(c["nodesByState"])),
                *(_cut(Text(extra.get(k, "-"))) for k, _ in WIDE_COLUMNS), _cut(why))
        body: list[RenderableType] = [table]
        if w["message"]:
            body.insert(0, Text(w["message"], style="dim"))
        parts.append(Panel(Group(*body), title=title, title_align="left"))
    if doc["haltedObjects"]:
        t = Table(title="halted / held objects", show_header=True, header_style="bold",
                  box=None)
        t.add_column("object")
        t.add_column("reason", overflow="fold")
        for o in doc["haltedObjects"]:
            t.add_row(f"{o['kind']} {o['namespace']}/{o['name']}", Text(o["reason"], "red"))
        parts.append(t)
    return Group(*parts)
