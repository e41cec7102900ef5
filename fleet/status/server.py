"""Plain-HTTP endpoints of the controller (aiohttp): /status, /healthz, /readyz, /metrics.

``StatusBoard`` holds the latest status document; the controller publishes into it after
every planning pass and the server only reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fleet.listen import start_site
from fleet.rollout.gate import GateDecision
from fleet.rollout.progress import ClusterProgress
from fleet.status.health import Health
from fleet.status.metrics import FleetMetrics
from fleet.status.model import build_status
from fleet.world.model import ClusterKey, Snapshot


class StatusBoard:
    """The latest fleet status, and the metrics registry that goes with it.

    ``publish`` only keeps the decision (cheap, once per controller pass); the document
    and the gauges are computed when someone asks (/status, /metrics), once per
    decision.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = FleetMetrics(self.registry)
        self._latest: tuple[GateDecision, Sequence[ClusterProgress],
                            dict[ClusterKey, str] | None] | None = None
        self._doc: dict[str, Any] | None = None
        self._body: bytes | None = None  # _doc as /status sends it
        self._gauges_from: dict[str, Any] | None = None
        self._observed: dict[ClusterKey, Snapshot] = {}  # each cluster's part last observed

    def publish(self, decision: GateDecision, clusters: Sequence[ClusterProgress], *,
                problems: dict[ClusterKey, str] | None = None) -> None:
        self._latest = (decision, clusters, problems)
        self._doc = self._body = None

    def observe_pass(self, snapshot: Snapshot) -> None:
        """Count the NodePlans' transitions: of the clusters whose snapshot part is new
        since the last pass (the same part object: none of its NodePlans moved), or of
        every NodePlan when the snapshot is not kept in parts."""
        parts = snapshot.parts
        if parts is None:
            self._observed = {}
            self.metrics.observe_nodeplans(snapshot.nodeplans.values())
            return
        seen = self._observed
        moved = [(k, part) for k, part in parts.items() if seen.get(k) is not part]
        seen.update(moved)
        if len(seen) > len(parts):
            self._observed = {k: part for k, part in seen.items() if k in parts}
        # One call (the first learns what exists: every part is new then).
        self.metrics.observe_nodeplans(
            p for _, part in moved for p in part.nodeplans.values())

    @property
    def status(self) -> dict[str, Any] | None:
        if self._doc is None and self._latest is not None:
            decision, clusters, problems = self._latest
            self._doc = build_status(decision, clusters, problems=problems)
        return self._doc

    @property
    def status_body(self) -> bytes | None:
        """:attr:`status` as JSON, encoded once per decision: a 1000-cluster document
        takes a noticeable share of a second to encode, on the controller's one event
        loop, and dashboards (or a benchmark) poll it far more often than it changes.
        Compact, by the C encoder: indented, json encodes in Python (the 1000-cluster
        document took 313 ms instead of 26 ms, and held ~23 MiB of string fragments at
        once instead of ~5 MiB: bench/README.md); ``jq`` indents it for a reader."""
        if self._body is None:
            doc = self.status
            if doc is not None:
                self._body = json.dumps(doc, separators=(",", ":")).encode()
        return self._body

    def refresh_metrics(self) -> None:
        doc = self.status
        if doc is not None and doc is not self._gauges_from:
            self.metrics.update_from_status(doc)
            self._gauges_from = doc


def make_app(board: StatusBoard, *, health: Health | None = None) -> web.Application:
    """``health``: the liveness and readiness checks (fleet.status.health); without it
    both endpoints answer 200 (only for tests of the other endpoints)."""
    checks = health or Health()

    async def status(_: web.Request) -> web.Response:
        body = board.status_body
        if body is None:
            return web.json_response({"error": "no rollout decision yet"}, status=503)
        return web.Response(body=body, content_type="application/json")

    def answer(problems: list[str], bad: str) -> web.Response:
        if not problems:
            return web.Response(text="ok\n")
        return web.Response(text=bad + "\n" + "".join(f"- {p}\n" for p in problems),
                            status=503)

    async def healthz(_: web.Request) -> web.Response:
        return answer(checks.live.problems(), "unhealthy")

    async def readyz(_: web.Request) -> web.Response:
        return answer(checks.ready.problems(), "not ready")

    async def metrics(_: web.Request) -> web.Response:
        board.refresh_metrics()
        body = generate_latest(board.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(app: web.Application, *, host: str = "0.0.0.0", port: int = 8080,
                task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled. ``task_status`` receives the bound port (0 = pick one)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await start_site(site, what="status and health endpoints", setting="status.port",
                         host=host, port=port)
        addresses = runner.addresses
        task_status.started(int(addresses[0][1]) if addresses else port)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
