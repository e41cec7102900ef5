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


WIDE_COLUMNS = (("executor", "executor"), ("step", "current step"), ("node", "node"),
                ("inStep", "in step"))


def render(doc: dict[str, Any], *, width: int = 30,
           wide: Mapping[str, Mapping[str, str]] | None = None) -> RenderableType:
    """The status document for a terminal; ``wide`` (``-o wide``: per ``namespace/name``
    the values of :data:`WIDE_COLUMNS`) adds those columns to each cluster's row."""
    r, s = doc["rollout"], doc["summary"]
    head = Text.assemble(
        ("fleet rollout ", "bold"), _phase(r["phase"]),
        f"   {s['nodesUpToDate']}/{s['nodes']} nodes up to date, "
        f"{s['clustersComplete']}/{s['clusters']} clusters complete   ",
        ("at " + doc["generatedAt"], "dim"))
    parts: list[RenderableType] = [head, ProgressBar(total=max(1, s["nodes"]),
                                                      completed=s["nodesUpToDate"], width=60)]
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
        table.add_column("cluster")
        table.add_column("phase")
        table.add_column("progress")
        table.add_column("nodes", justify="right")
        table.add_column("by state")
        if wide is not None:
            for _, title_ in WIDE_COLUMNS:
                table.add_column(title_)
        table.add_column("why not now", overflow="fold", max_width=60)
        for c in w["clusters"]:
            extra = wide.get(f"{c['namespace']}/{c['name']}", {}) if wide is not None else {}
            table.add_row(
                f"{c['namespace']}/{c['name']}",
                _phase("Unreachable" if c.get("unreachableSince") else c["phase"]),
                ProgressBar(total=max(1, c["nodes"]), completed=c["upToDate"], width=width),
                f"{c['upToDate']}/{c['nodes']}", _states(c["nodesByState"]),
                *([extra.get(k, "-") for k, _ in WIDE_COLUMNS] if wide is not None else []),
                Text(c["problem"] or c["reason"] or "", style="dim"))
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
