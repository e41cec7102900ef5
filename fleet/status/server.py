"""Plain-HTTP endpoints of the controller (aiohttp): /status, /healthz, /readyz, /metrics.

``StatusBoard`` holds the latest status document; the controller publishes into it after
every planning pass and the server only reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fleet.model import ClusterKey
from fleet.rollout.gate import GateDecision
from fleet.rollout.progress import ClusterProgress
from fleet.status.metrics import FleetMetrics
from fleet.status.model import build_status


class StatusBoard:
    """The latest fleet status, and the metrics registry that goes with it."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = FleetMetrics(self.registry)
        self.status: dict[str, Any] | None = None

    def publish(self, decision: GateDecision, clusters: Sequence[ClusterProgress], *,
                problems: dict[ClusterKey, str] | None = None) -> dict[str, Any]:
        doc = build_status(decision, clusters, problems=problems)
        self.status = doc
        self.metrics.update_from_status(doc)
        return doc


def _always() -> bool:
    return True


def make_app(board: StatusBoard, *, ready: Callable[[], bool] = _always,
             live: Callable[[], bool] = _always) -> web.Application:
    """``ready``: e.g. "caches synced and leading"; ``live``: "the loop still turns"."""

    async def status(_: web.Request) -> web.Response:
        if board.status is None:
            return web.json_response({"error": "no rollout decision yet"}, status=503)
        return web.json_response(board.status, dumps=lambda o: json.dumps(o, indent=1))

    async def healthz(_: web.Request) -> web.Response:
        ok = live()
        return web.Response(text="ok\n" if ok else "unhealthy\n", status=200 if ok else 503)

    async def readyz(_: web.Request) -> web.Response:
        ok = ready()
        return web.Response(text="ok\n" if ok else "not ready\n", status=200 if ok else 503)

    async def metrics(_: web.Request) -> web.Response:
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
        await site.start()
        addresses = runner.addresses
        task_status.started(int(addresses[0][1]) if addresses else port)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
