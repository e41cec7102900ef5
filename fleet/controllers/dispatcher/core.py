"""Write-through plumbing every dispatcher write shares: a patch that re-checks its change
on the freshest object and puts what the API server returned into the caches at once,
Events recorded in the background, the owner objects' resources and cached copies, the
statistics, and ``perform`` (one action to its ``_do_<Action>`` method).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
from opentelemetry import trace

from fleet.artifacts import ArtifactResolver
from fleet.config.models import FleetConfig
from fleet.controllers.observe import ManagementView
from fleet.events import NORMAL, EventRecorder
from fleet.kube import KubeClient, KubeObject, NotFoundError
from fleet.kube.cache import ObjectCache, RecordCache
from fleet.kube.patch import patch_with_retry
from fleet.kube.resources import (
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    Resource,
)
from fleet.planner.actions import Action
from fleet.world.clusters import ClusterRegistry
from fleet.world.model import (
    KIND_HOSTED_CP,
    KIND_KCP,
    KIND_MD,
    KIND_NODEPLAN,
    KIND_WORKER_TEMPLATE,
    Condition,
    ObjectRef,
    format_time,
)

OWNER_RESOURCES: dict[str, Resource] = {KIND_MD: MACHINE_DEPLOYMENTS, KIND_KCP: K0S_CONTROL_PLANES,
                                        KIND_NODEPLAN: NODE_PLANS, "Machine": MACHINES,
                                        "MachineSet": MACHINE_SETS,
                                        KIND_WORKER_TEMPLATE: K0S_WORKER_CONFIG_TEMPLATES,
                                        KIND_HOSTED_CP: K0SMOTRON_CONTROL_PLANES}


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class DispatchStats:
    """What the dispatcher did (for tests and benchmarks)."""

    writes: int = 0
    creates: int = 0
    already: int = 0
    declined: int = 0
    errors: int = 0
    by_action: dict[str, int] = field(default_factory=dict)

    def count(self, action: Action) -> None:
        name = type(action).__name__
        self.by_action[name] = self.by_action.get(name, 0) + 1


def _condition_list(existing: list[dict[str, Any]], wanted: tuple[Condition, ...],
                    now: datetime) -> list[dict[str, Any]]:
    """Conditions with ours replaced; lastTransitionTime moves only when status changes."""
    by_type = {c.get("type"): c for c in existing if isinstance(c, dict)}
    out = [c for c in existing if isinstance(c, dict)
           and c.get("type") not in {w.type for w in wanted}]
    for w in wanted:
        old = by_type.get(w.type)
        ltt = old.get("lastTransitionTime") if old and old.get("status") == w.status else None
        out.append({"type": w.type, "status": w.status, "reason": w.reason or w.status,
                    "message": w.message, "lastTransitionTime": ltt or format_time(now)})
    return out


class DispatcherCore:
    """What every part of the :class:`~fleet.controllers.dispatcher.Dispatcher` uses: its
    clients, caches and services, and the write-through patch."""

    def __init__(self, *, mgmt: KubeClient, view: ManagementView, registry: ClusterRegistry,
                 config: FleetConfig, recorder: EventRecorder, tracer: trace.Tracer,
                 clock: Callable[[], datetime] = _now,
                 artifacts: ArtifactResolver | None = None) -> None:
        self.mgmt = mgmt
        self.view = view
        self.registry = registry
        self.config = config
        self.recorder = recorder
        self.tracer = tracer
        self.clock = clock
        self.artifacts = artifacts or ArtifactResolver(config.download)
        self.stats = DispatchStats()
        self.unsure: set[tuple[str, str]] = set()
        self.background: anyio.abc.TaskGroup | None = None
        self._events = anyio.CapacityLimiter(8)  # Events being recorded in the background

    # -- plumbing ------------------------------------------------------------------------
    def _cache_for(self, res: Resource) -> ObjectCache | None:
        return self.view.caches.get(res)

    def _remember(self, res: Resource, obj: KubeObject | None) -> None:
        cache = self._cache_for(res)
        if cache is not None and obj:
            obj.setdefault("kind", res.kind)
            obj.setdefault("apiVersion", res.api_version)
            cache.observe(obj)

    async def _patch(self, client: KubeClient, res: Resource, name: str, namespace: str | None,
                     mutate: Callable[[KubeObject], dict[str, Any] | None], *,
                     subresource: str | None = None,
                     cache: ObjectCache | RecordCache[Any] | None = None
                     ) -> KubeObject | None:
        known = cache if cache is not None else self._cache_for(res)
        # A workload RecordCache gives the kept subset of the object with its
        # resourceVersion: mutate reads only what is kept, and the precondition makes the
        # API server refuse the patch if the object moved on since.
        current = known.object(name, namespace or "") if known is not None else None
        if current is not None and not (current.get("metadata") or {}).get("resourceVersion"):
            current = None  # a provisional copy of ours: read the real thing
        try:
            obj = await patch_with_retry(client, res, name, mutate, namespace,
                                         subresource=subresource, current=current)
        except NotFoundError:
            if current is None:
                raise
            # The cached object was stale (deleted and recreated?): retry from a fresh read.
            obj = await patch_with_retry(client, res, name, mutate, namespace,
                                         subresource=subresource)
        if obj is None:
            self.stats.declined += 1
            return None
        self.stats.writes += 1
        obj.setdefault("kind", res.kind)
        obj.setdefault("apiVersion", res.api_version)
        if cache is not None:
            cache.observe(obj)
        else:
            self._remember(res, obj)
        return obj

    async def perform(self, action: Action) -> None:
        """Perform one action. Raises KubeError for the caller to log and retry later."""
        self.stats.count(action)
        handler = getattr(self, f"_do_{type(action).__name__}")
        await handler(action)

    async def event(self, regarding: Any, reason: str, note: str, *, type: str = NORMAL,
                    action: str = "Upgrade", related: Any = None, key: str = "") -> None:
        """Record an Event; in the background when the controller gave us a task group
        (Events are for humans: they must never delay the next node)."""
        async def emit() -> None:
            await self.recorder.emit(regarding, reason=reason, action=action, note=note,
                                     type=type, related=related, key=key)

        if self.background is not None:
            self.background.start_soon(self._bounded, emit)
        else:
            await emit()

    async def _bounded(self, emit: Callable[[], Awaitable[None]]) -> None:
        # A fresh fleet's start-up records thousands of Events at once: a few at a time,
        # each on a kept-alive connection, not one new connection per Event.
        async with self._events:
            await emit()

    def _owner_obj(self, ref: ObjectRef) -> KubeObject | None:
        res = OWNER_RESOURCES.get(ref.kind)
        return None if res is None else self.view[res].get(ref.name, ref.namespace)
