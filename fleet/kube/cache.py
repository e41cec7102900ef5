"""Object caches fed by watches, and by the controller's own writes.

A Reflector tells the cache about every change it sees. The controller also tells it
about every object its own writes returned ("write-through"), so that the next planning
pass already sees what it just did, instead of re-deciding on a cache the watch has not
caught up with yet: without that, a pass right after a dispatch could dispatch again.
An object only ever moves forward: an event older than what the cache holds (by
resourceVersion) is ignored.

:class:`ObjectCache` holds the objects as the API server sent them, without
``metadata.managedFields``. :class:`RecordCache`
holds compact records instead, converted on ingest by a function the caller gives: for
objects of which only a few facts are read, at a scale where the full JSON would be most
of the process's memory (a workload cluster's Nodes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from fleet.kube import KubeObject
from fleet.kube.watch import ObjectKey, WatchEvent, object_key

log = logging.getLogger(__name__)

T = TypeVar("T")
V = TypeVar("V")

Listener = Callable[[], None]
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Told which object changed (None: possibly all of them: synced, or cleared).
ObjectListener = Callable[[KubeObject | None], None]


def _rv(obj: KubeObject) -> int | None:
    raw = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    # resourceVersions are opaque by contract; every API server stores etcd revisions.
    return int(raw) if raw.isdigit() else None


def newer_or_same(new: KubeObject, old: KubeObject | None) -> bool:
    if old is None:
        return True
    a, b = _rv(new), _rv(old)
    return a is None or b is None or a >= b


class _Cache(Generic[V]):
    """What both caches share: entries by object key, tombstones of deleted objects (so a
    late event cannot resurrect them), the change counter and listeners, the watch's
    events and the synced flag. Subclasses decide what an entry is (:meth:`observe`)."""

    def __init__(self, kind: str, *, on_change: Listener | None = None,
                 on_object: ObjectListener | None = None) -> None:
        self.kind = kind
        self.on_change = on_change
        self.on_object = on_object
        self._entries: dict[ObjectKey, V] = {}
        # Deleted objects' last resourceVersion.
        self._tombstones: dict[ObjectKey, int] = {}
        self.synced = False
        self.version = 0  # bumped on every change: cheap "did anything move?"

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[V]:
        return iter(list(self._entries.values()))

    def get(self, name: str, namespace: str = "") -> V | None:
        return self._entries.get((namespace, name))

    def items(self) -> list[V]:
        return list(self._entries.values())

    def _changed(self, obj: KubeObject | None = None) -> None:
        self.version += 1
        if self.on_object is not None:
            self.on_object(obj)
        if self.on_change is not None:
            self.on_change()

    def _buried(self, key: ObjectKey, rv: int | None) -> bool:
        """True if ``key`` was deleted at ``rv`` or later (the event is older)."""
        tomb = self._tombstones.get(key)
        return tomb is not None and rv is not None and rv <= tomb

    def observe(self, obj: KubeObject | None) -> None:
        raise NotImplementedError

    def _forgotten(self, key: ObjectKey) -> None:
        """Hook: ``key`` was deleted."""

    def _cleared(self) -> None:
        """Hook: everything was dropped."""

    def forget(self, obj: KubeObject) -> None:
        key = object_key(obj)
        old = self._entries.pop(key, None)
        self._forgotten(key)
        rv = _rv(obj)
        if rv is not None:
            self._tombstones[key] = rv
            if len(self._tombstones) > 10_000:
                self._tombstones.pop(next(iter(self._tombstones)))
        if old is not None:
            self._changed(self._as_changed(old))

    def _as_changed(self, entry: V) -> KubeObject | None:
        """What ``on_object`` is told about a removed entry."""
        return None

    def clear(self) -> None:
        self._cleared()
        if self._entries:
            self._entries.clear()
            self._changed()
        self.synced = False

    async def on_event(self, event: WatchEvent) -> None:
        """Reflector listener."""
        if event.type == "DELETED":
            self.forget(event.object)
        else:
            self.observe(event.object)

    def mark_synced(self) -> None:
        if not self.synced:
            self.synced = True
            self._changed()


class ObjectCache(_Cache[KubeObject]):
    """Latest known version of every object of one resource (one API server)."""

    def __init__(self, kind: str, *, on_change: Listener | None = None,
                 on_object: ObjectListener | None = None) -> None:
        super().__init__(kind, on_change=on_change, on_object=on_object)
        self._memo: dict[tuple[ObjectKey, str], tuple[str, Any]] = {}

    def object(self, name: str, namespace: str = "") -> KubeObject | None:
        """The object as last seen: the base of a patch (see :class:`RecordCache`)."""
        return self.get(name, namespace)

    def parsed(self, obj: KubeObject, parse: Callable[[KubeObject], T], tag: str = "") -> T:
        """``parse(obj)``, remembered per object version: planning passes re-read
        thousands of unchanged objects."""
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if not rv:
            return parse(obj)
        key = (object_key(obj), tag)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == rv:
            return hit[1]  # type: ignore[no-any-return]
        value = parse(obj)
        self._memo[key] = (rv, value)
        if len(self._memo) > 4 * len(self._entries) + 1024:
            live = {object_key(o) for o in self._entries.values()}
            self._memo = {k: v for k, v in self._memo.items() if k[0] in live}
        return value

    def _as_changed(self, entry: KubeObject) -> KubeObject | None:
        return entry

    def observe(self, obj: KubeObject | None) -> None:
        """An object as the API server returned it (watch event, or our own write).
        Its ``metadata.managedFields`` (server-side apply bookkeeping, often a third of an
        object) and kubectl's last-applied-configuration annotation (a second copy of the
        object as applied), read by nothing here, are dropped, from ``obj`` itself. A merge
        patch computed against the cached copy leaves them as they are on the server."""
        if not obj:
            return
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
            annotations = meta.get("annotations")
            if isinstance(annotations, dict):
                annotations.pop(LAST_APPLIED, None)
        key = object_key(obj)
        if self._buried(key, _rv(obj)):
            return
        old = self._entries.get(key)
        if newer_or_same(obj, old):
            if old == obj:
                return
            self._entries[key] = obj
            self._tombstones.pop(key, None)
            self._changed(obj)


class Record(Protocol):
    """A compact, immutable record of one object. Records compare equal when the facts
    they keep are the same, whatever their resourceVersion."""

    @property
    def key(self) -> ObjectKey: ...

    @property
    def resource_version(self) -> str: ...

    def as_object(self) -> KubeObject:
        """The JSON subset the record keeps, with name and resourceVersion."""
        ...


R = TypeVar("R", bound=Record)


def _record_rv(record: Record) -> int | None:
    raw = record.resource_version
    return int(raw) if raw.isdigit() else None


class RecordCache(_Cache[R]):
    """Latest known record of every object of one resource (one API server).

    ``convert`` makes the record of an object as the API server sent it, or raises
    ValueError naming what is wrong. Objects are converted on arrival and never kept.
    A newer version with the same facts replaces the record (its resourceVersion is the
    one a patch must carry) without counting as a change: nothing decided on it moved.
    An object that cannot be converted is dropped from the cache (no decision on a stale
    record), its error kept in ``unreadable`` and logged once per distinct error.
    """

    def __init__(self, kind: str, convert: Callable[[KubeObject], R], *,
                 on_change: Listener | None = None) -> None:
        super().__init__(kind, on_change=on_change)
        self.convert = convert
        self.unreadable: dict[ObjectKey, str] = {}

    def object(self, name: str, namespace: str = "") -> KubeObject | None:
        """The kept subset of the object, as JSON with its resourceVersion: the base of a
        merge patch sent with that resourceVersion as precondition."""
        record = self.get(name, namespace)
        return None if record is None else record.as_object()

    def observe(self, obj: KubeObject | None) -> None:
        """An object as the API server returned it (watch event, or our own write)."""
        if not obj:
            return
        key = object_key(obj)
        rv = _rv(obj)
        if self._buried(key, rv):
            return
        old = self._entries.get(key)
        if old is not None:
            old_rv = _record_rv(old)
            if rv is not None and old_rv is not None and rv < old_rv:
                return
        try:
            record = self.convert(obj)
        except ValueError as e:
            message = str(e)
            if self.unreadable.get(key) != message:
                log.warning("ignoring %s %s: %s", self.kind, "/".join(p for p in key if p),
                            message)
            self.unreadable[key] = message
            if self._entries.pop(key, None) is not None:
                self._changed()
            return
        self.unreadable.pop(key, None)
        self._tombstones.pop(key, None)
        self._entries[key] = record
        if record != old:
            self._changed()

    def _forgotten(self, key: ObjectKey) -> None:
        self.unreadable.pop(key, None)

    def _cleared(self) -> None:
        self.unreadable.clear()


def unwrap(obj: Any) -> KubeObject | None:
    return obj if isinstance(obj, dict) else None
