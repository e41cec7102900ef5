"""Kubernetes Events (events.k8s.io/v1) for humans: one helper, deduplicated.

``EventRecorder.emit(regarding, reason=..., action=..., note=...)`` creates an Event in
the regarding object's namespace (or ``default_namespace`` for cluster-scoped objects).
The Event's name is derived from what it says (regarding object, reason, action, note
and an optional ``key``), so the same Event is created at most once, even across a
controller restart or by two replicas: a second attempt meets AlreadyExists and is
dropped. Callers that want a repeat to show up again pass a ``key`` that changes (the
time of the transition, say). A small in-memory cache saves the API round trip for
repeats within one process. Emitting never raises: Events are best effort.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fleet.kube import AlreadyExistsError, KubeClient, KubeError
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    EVENTS,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
)
from fleet.world.model import truncate

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "fleet.k0s-fleet.io/controller"
NORMAL = "Normal"
WARNING = "Warning"
_MAX_NOTE = 1024  # the API's limit on note
_MAX_FIELD = 128  # reason and action

_API_VERSIONS: dict[str, str] = {
    r.kind: r.api_version
    for r in (CLUSTERS, CONFIGMAPS, K0S_CONTROL_PLANES, MACHINE_DEPLOYMENTS, MACHINE_SETS,
              MACHINES, NODE_PLANS, NODES)
}


@dataclass(frozen=True, slots=True)
class Regarding:
    """The object an Event is about (or related to)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = ""

    @classmethod
    def of(cls, obj: Any) -> Regarding:
        """From a plain API object (dict), a fleet.world.model.ObjectRef, or a Regarding."""
        if isinstance(obj, Regarding):
            return obj
        if isinstance(obj, Mapping):
            meta = obj.get("metadata") or {}
            return cls(kind=str(obj.get("kind") or ""), name=str(meta.get("name") or ""),
                       namespace=str(meta.get("namespace") or ""),
                       uid=str(meta.get("uid") or ""),
                       api_version=str(obj.get("apiVersion") or ""))
        kind, name = getattr(obj, "kind", None), getattr(obj, "name", None)
        if not isinstance(kind, str) or not isinstance(name, str):
            raise TypeError(f"cannot tell what {obj!r} refers to")
        return cls(kind=kind, name=name, namespace=str(getattr(obj, "namespace", "") or ""),
                   uid=str(getattr(obj, "uid", "") or ""))

    def reference(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version or _API_VERSIONS.get(self.kind, ""),
               "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return {k: v for k, v in ref.items() if v}


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _micro_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_name(regarding: Regarding, reason: str, action: str, note: str, key: str = "") -> str:
    """Deterministic Event name: same content, same name."""
    digest = hashlib.sha256("\x00".join(
        (regarding.kind, regarding.namespace, regarding.name, regarding.uid, reason, action,
         note, key)).encode()).hexdigest()[:16]
    base = regarding.name.lower()[:200].rstrip(".-") or "object"
    return f"{base}.{digest}"


class EventRecorder:
    """Emits Events through one management-cluster client."""

    def __init__(self, client: KubeClient, *, instance: str,
                 controller: str = REPORTING_CONTROLLER, default_namespace: str = "default",
                 clock: Callable[[], datetime] = _utcnow, cache_size: int = 4096) -> None:
        self.client = client
        self.instance = instance
        self.controller = controller
        self.default_namespace = default_namespace
        self.clock = clock
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._cache_size = cache_size

    def _remember(self, name: str) -> None:
        self._seen[name] = None
        self._seen.move_to_end(name)
        while len(self._seen) > self._cache_size:
            self._seen.popitem(last=False)

    async def emit(self, regarding: Any, *, reason: str, action: str, note: str,
                   type: str = NORMAL, related: Any = None, key: str = "") -> bool:
        """Create the Event unless it exists already. True when this call created it."""
        ref = Regarding.of(regarding)
        reason, action = truncate(reason, _MAX_FIELD), truncate(action, _MAX_FIELD)
        note = truncate(note, _MAX_NOTE)
        name = event_name(ref, reason, action, note, key)
        namespace = ref.namespace or self.default_namespace
        cache_key = f"{namespace}/{name}"
        if cache_key in self._seen:
            return False
        body: dict[str, Any] = {
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "k0s-fleet"}},
            "eventTime": _micro_time(self.clock()),
            "reportingController": self.controller,
            "reportingInstance": truncate(self.instance, _MAX_FIELD),
            "action": action,
            "reason": reason,
            "note": note,
            "type": type,
            "regarding": ref.reference(),
        }
        if related is not None:
            body["related"] = Regarding.of(related).reference()
        try:
            await self.client.create(EVENTS, body, namespace)
        except AlreadyExistsError:
            self._remember(cache_key)
            return False
        except KubeError as e:
            log.warning("could not record event %s on %s %s/%s: %s", reason, ref.kind,
                        namespace, ref.name, e)
            return False
        self._remember(cache_key)
        return True


async def list_events(client: KubeClient, namespace: str, *,
                      regarding_name: str | None = None) -> list[dict[str, Any]]:
    """Events in ``namespace`` (about ``regarding_name`` if given), oldest first."""
    selector = f"regarding.name={regarding_name}" if regarding_name else None
    items = (await client.list(EVENTS, namespace, field_selector=selector)).items
    return sorted(items, key=lambda e: str(e.get("eventTime") or ""))


__all__ = [
    "NORMAL",
    "REPORTING_CONTROLLER",
    "WARNING",
    "EventRecorder",
    "Regarding",
    "event_name",
    "list_events",
]
