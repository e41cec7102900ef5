"""Object caches fed by watches, and by the controller's own writes.

A Reflector tells the cache about every change it sees. The controller also tells it
about every object its own writes returned ("write-through"), so that the next planning
pass already sees what it just did, instead of re-deciding on a cache the watch has not
caught up with yet: without that, a pass right after a dispatch could dispatch again.
An object only ever moves forward: an event older than what the cache holds (by
resourceVersion) is ignored.

:class:`ObjectCache` holds the objects as the API server sent them, without
``metadata.managedFields``, or only the JSON subset a projection keeps of them
(:class:`Kept`: the management objects, of which the controller reads a few fields of
thousands, :mod:`fleet.world.kept`). :class:`RecordCache`
holds compact records instead, converted on ingest by a function the caller gives: for
objects of which only a few facts are read, at a scale where the full JSON would be most
of the process's memory (a workload cluster's Nodes).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from fleet.kube import KubeObject
from fleet.kube.watch import ObjectKey, WatchEvent, object_key
from fleet.kube.wire import SharedObject

log = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E")  # what the cache stores per object
V = TypeVar("V")  # what its readers get

Listener = Callable[[], None]
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Told which object changed (None: possibly all of them: synced, or cleared).
ObjectListener = Callable[[KubeObject | None], None]


def _digits(raw: str) -> int | None:
    # resourceVersions are opaque by contract; every API server stores etcd revisions.
    return int(raw) if raw.isdigit() else None


def _rv_str(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _rv(obj: KubeObject) -> int | None:
    return _digits(_rv_str(obj))


def newer_or_same(new: KubeObject, old: KubeObject | None) -> bool:
    if old is None:
        return True
    a, b = _rv(new), _rv(old)
    return a is None or b is None or a >= b


class NotHeld(LookupError):
    """The cache holds no object of that key."""


class _Cache(Generic[E, V]):
    """What both caches share: entries by object key, tombstones of deleted objects (so a
    late event cannot resurrect them), the forward-only rule (an object older than what is
    held is ignored), the change counter and listeners, the watch's events and the synced
    flag. Subclasses decide what an entry is of an object let in (:meth:`_take`), its
    resourceVersion (:meth:`_held_rv`) and what a reader gets of it (:meth:`_out`).
    An entry is whatever the subclass stores: the core adds nothing per object."""

    def __init__(self, kind: str, *, on_change: Listener | None = None,
                 on_object: ObjectListener | None = None) -> None:
        self.kind = kind
        self.on_change = on_change
        self.on_object = on_object
        self._entries: dict[ObjectKey, E] = {}
        # Deleted objects' last resourceVersion.
        self._tombstones: dict[ObjectKey, int] = {}
        self.synced = False
        self.version = 0  # bumped on every change: cheap "did anything move?"
        # The key of the object ``on_object`` is being told about (the cache's own tuple:
        # a listener indexing objects by key keeps that one instead of a second copy).
        self.changed_key: ObjectKey | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[V]:
        return iter(self.items())

    def __contains__(self, key: object) -> bool:
        """Whether the object of ``(namespace, name)`` is held (without reading it)."""
        return key in self._entries

    def get(self, name: str, namespace: str = "") -> V | None:
        entry = self._entries.get((namespace, name))
        return None if entry is None else self._out(entry)

    def items(self) -> list[V]:
        return [self._out(e) for e in list(self._entries.values())]

    def _out(self, entry: E) -> V:
        raise NotImplementedError

    def _held_rv(self, entry: E) -> str:
        """The resourceVersion of a held entry ('' if it has none)."""
        raise NotImplementedError

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
        """An object as the API server returned it (watch event, or our own write): handed
        to :meth:`_take` unless its key was deleted at its resourceVersion or later, or the
        cache holds a newer version of it."""
        if not obj:
            return
        key = object_key(obj)
        rv = _rv(obj)
        if self._buried(key, rv):
            return
        old = self._entries.get(key)
        if old is not None and rv is not None:
            old_rv = _digits(self._held_rv(old))
            if old_rv is not None and rv < old_rv:
                return
        self._take(key, obj, old)

    def _take(self, key: ObjectKey, obj: KubeObject, old: E | None) -> None:
        """Hook: hold ``obj`` (not older than ``old``, what is held of ``key``)."""
        raise NotImplementedError

    def _store(self, key: ObjectKey, entry: E) -> None:
        self._entries[key] = entry
        self._tombstones.pop(key, None)

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
            self.changed_key = key
            self._changed(self._as_changed(old))

    def _as_changed(self, entry: E) -> KubeObject | None:
        """What ``on_object`` is told about a removed entry."""
        return None

    def clear(self) -> None:
        self._cleared()
        if self._entries:
            self._entries.clear()
            self._changed()
        self.synced = False

    def take_event(self, event: WatchEvent) -> None:
        """A Reflector's sink: the event taken at once."""
        if event.type == "DELETED":
            self.forget(event.object)
        else:
            self.observe(event.object)

    async def on_event(self, event: WatchEvent) -> None:
        """Reflector listener."""
        self.take_event(event)

    def mark_synced(self) -> None:
        if not self.synced:
            self.synced = True
            self._changed()


Projection = Callable[[KubeObject], KubeObject]


@dataclass(frozen=True, slots=True)
class Kept:
    """What an :class:`ObjectCache` with a projection keeps of one object: the projected
    JSON, compact, as one bytes object (no nested dicts for the garbage collector to
    walk), without its resourceVersion, which is kept beside it."""

    resource_version: str
    body: bytes

    @classmethod
    def of(cls, projected: KubeObject) -> Kept:
        meta = projected.get("metadata")
        rv = ""
        if isinstance(meta, dict) and "resourceVersion" in meta:
            meta = dict(meta)
            rv = str(meta.pop("resourceVersion") or "")
            projected = {**projected, "metadata": meta}
        return cls(rv, json.dumps(projected, separators=(",", ":"),
                                  ensure_ascii=False).encode())

    def as_object(self) -> KubeObject:
        """The kept JSON, with its resourceVersion (a fresh copy each time)."""
        obj: KubeObject = json.loads(self.body)
        meta = obj.get("metadata")
        if self.resource_version and isinstance(meta, dict):
            meta["resourceVersion"] = self.resource_version
        return obj


class ForeignKept(bytes):
    """What an :class:`ObjectCache` keeps of an object a sharded replica only looks at (a
    cluster another replica acts on): one bytes object, the resourceVersion's digits, a
    NUL, then the projected JSON (without its resourceVersion) deflated against a preset
    dictionary of the resource's usual vocabulary (the cache's ``zdict``: a few hundred
    bytes of JSON come to about a hundred). No wrapper, no separate string: for thousands
    of clusters, per-object overheads are most of what is kept. Its parse is not
    remembered (read again only when its cluster moves)."""

    __slots__ = ()

    @classmethod
    def pack(cls, projected: KubeObject, zdict: bytes) -> ForeignKept:
        plain = Kept.of(projected)
        z = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict=zdict)
        return cls(plain.resource_version.encode("ascii", "backslashreplace") + b"\0"
                   + z.compress(plain.body) + z.flush())

    @property
    def resource_version(self) -> str:
        return self[:self.index(0)].decode("ascii")

    @property
    def body(self) -> bytes:
        """The deflated JSON (compared to tell whether what is kept changed)."""
        return self[self.index(0) + 1:]

    def unpack(self, zdict: bytes) -> KubeObject:
        """The kept JSON, with its resourceVersion (a fresh copy each time)."""
        z = zlib.decompressobj(-15, zdict=zdict)
        return Kept(self.resource_version, z.decompress(self.body) + z.flush()).as_object()


Entry = KubeObject | Kept | ForeignKept


class ObjectCache(_Cache[Entry, KubeObject]):
    """Latest known version of every object of one resource (one API server).

    Without ``keep`` the objects are held as the API server sent them (less what
    :meth:`observe` drops). With ``keep`` (a projection: the JSON subset of an object that
    its readers use, never failing on odd input) only that subset is held, as
    :class:`Kept`; readers get it back as JSON with its resourceVersion, a fresh copy per
    read, so the merge patch a writer computes against it touches only kept fields and
    its resourceVersion precondition makes the server refuse it if the object moved on.
    A newer version with the same kept subset only moves the resourceVersion: nothing
    read of it changed, so listeners are not told.
    """

    def __init__(self, kind: str, *, on_change: Listener | None = None,
                 on_object: ObjectListener | None = None,
                 keep: Projection | None = None,
                 foreign: Callable[[KubeObject], bool] | None = None,
                 zdict: bytes = b"") -> None:
        super().__init__(kind, on_change=on_change, on_object=on_object)
        self.keep = keep
        # With ``keep``: whether an object is only looked at (a sharded replica's foreign
        # cluster): kept as :class:`ForeignKept` (compressed against ``zdict``), its
        # parses not remembered.
        self.foreign = foreign
        self.zdict = zdict
        self._memo: dict[tuple[ObjectKey, str], tuple[str, Any]] = {}
        self._tags: set[str] = set()  # the tags parses were remembered under

    def _out(self, entry: Entry) -> KubeObject:
        if isinstance(entry, ForeignKept):
            return entry.unpack(self.zdict)
        return entry.as_object() if isinstance(entry, Kept) else entry

    def _held_rv(self, entry: Entry) -> str:
        if isinstance(entry, (Kept, ForeignKept)):
            return entry.resource_version
        return _rv_str(entry)

    def object(self, name: str, namespace: str = "") -> KubeObject | None:
        """The object as last seen: the base of a patch (see :class:`RecordCache`)."""
        return self.get(name, namespace)

    def resource_version(self, name: str, namespace: str = "") -> str | None:
        """The held object's resourceVersion (None: not held), without reading it."""
        entry = self._entries.get((namespace, name))
        return None if entry is None else self._held_rv(entry)

    def object_keys(self) -> list[ObjectKey]:
        """The held objects' keys ``(namespace, name)``, without reading them."""
        return list(self._entries)

    def versions(self, namespace: str | None = None) -> dict[ObjectKey, str]:
        """The resourceVersion of every held object (of ``namespace``; None: all): what a
        Reflector feeding only this cache compares a re-list with."""
        out: dict[ObjectKey, str] = {}
        for key in list(self._entries):
            if namespace is None or key[0] == namespace:
                out[key] = self.resource_version(key[1], key[0]) or ""
        return out

    def describe(self, key: ObjectKey) -> tuple[str, str, str]:
        """(namespace, name, resourceVersion) of a held object (for messages)."""
        namespace, name = key
        return namespace, name, self.resource_version(name, namespace) or ""

    def parsed(self, key: ObjectKey, parse: Callable[[KubeObject], T], tag: str = "") -> T:
        """``parse`` of the held object of ``key`` (``(namespace, name)``), remembered per
        object version: planning passes re-read thousands of unchanged objects, and a
        remembered version is neither decoded nor parsed again. Raises what ``parse``
        raises, and :class:`NotHeld` (a LookupError, not a KeyError) for an object not
        held."""
        entry = self._entries.get(key)
        if entry is None:
            raise NotHeld(f"{self.kind} {'/'.join(p for p in key if p)} is not held")
        if isinstance(entry, ForeignKept):
            return parse(entry.unpack(self.zdict))  # not remembered: read when its cluster moves
        rv = self._held_rv(entry)
        if rv:
            hit = self._memo.get((key, tag))
            if hit is not None and hit[0] == rv:
                return hit[1]  # type: ignore[no-any-return]
        return self._remember(key, rv, tag, parse(self._out(entry)))

    def parsed_object(self, obj: KubeObject, parse: Callable[[KubeObject], T],
                      tag: str = "") -> T:
        """``parse(obj)`` for an object already at hand (a change a listener is told
        of), remembered as :meth:`parsed` remembers it."""
        rv = _rv_str(obj)
        key = object_key(obj)
        entry = self._entries.get(key)
        if isinstance(entry, ForeignKept) and entry.resource_version == rv:
            return parse(obj)  # a foreign object's parse is not remembered
        if rv:
            hit = self._memo.get((key, tag))
            if hit is not None and hit[0] == rv:
                return hit[1]  # type: ignore[no-any-return]
        return self._remember(key, rv, tag, parse(obj))

    def _remember(self, key: ObjectKey, rv: str, tag: str, value: T) -> T:
        if not rv:
            return value
        self._tags.add(tag)
        self._memo[(key, tag)] = (rv, value)
        if len(self._memo) > 4 * len(self._entries) + 1024:
            live = set(self._entries)
            self._memo = {k: v for k, v in self._memo.items() if k[0] in live}
        return value

    def _as_changed(self, entry: Entry) -> KubeObject | None:
        return self._out(entry)

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
        super().observe(obj)

    def _take(self, key: ObjectKey, obj: KubeObject, old: Entry | None) -> None:
        if self.keep is None:
            if old == obj:
                return
            self._store(key, obj)
            self._changed(obj)
            return
        projected = self.keep(obj)
        kept: Kept | ForeignKept = ForeignKept.pack(projected, self.zdict) \
            if self.foreign is not None and self.foreign(obj) else Kept.of(projected)
        self._store(key, kept)
        if isinstance(kept, ForeignKept) and self._tags:
            for tag in self._tags:  # what was remembered of it while it was held
                self._memo.pop((key, tag), None)
        if not isinstance(old, (Kept, ForeignKept)) or type(old) is not type(kept) \
                or old.body != kept.body:
            if isinstance(old, (Kept, ForeignKept)) \
                    and old.resource_version == kept.resource_version:
                # More or less kept of the same version (a sharded replica's foreign
                # subset, or the object read again in full): what was parsed of it goes.
                for tag in self._tags:
                    self._memo.pop((key, tag), None)
            # what was kept, with its resourceVersion (not a decode of the kept bytes)
            self.changed_key = key
            self._changed(projected)

    def rekeep(self, keys: Iterable[ObjectKey]) -> None:
        """Apply ``keep`` again to the held objects of ``keys`` (what it keeps of them
        changed: a sharded replica gave their cluster back). Only less can come of it: what
        was dropped is back only once the object is read again."""
        if self.keep is None:
            return
        for key in keys:
            entry = self._entries.get(key)
            if isinstance(entry, (Kept, ForeignKept)):
                self.observe(self._out(entry))


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


class Remembered(Generic[R]):
    """``convert``, remembered for the last ``size`` decoded objects it was given
    (:class:`~fleet.kube.wire.SharedObject`, which nobody changes), by identity (each kept
    alive meanwhile, so an identity is never another object's): the watches of many
    clusters sharing objects are handed the same decoded event
    (:func:`fleet.kube.wire.decode_watch_line`), and then share its record too, made
    once. Any other object (a write's answer, a whole object) is converted every time."""

    def __init__(self, convert: Callable[[KubeObject], R], size: int = 256) -> None:
        self.convert = convert
        self.size = size
        self._recent: dict[int, tuple[KubeObject, R]] = {}
        self.hits = 0

    def __call__(self, obj: KubeObject) -> R:
        if type(obj) is not SharedObject:
            return self.convert(obj)
        hit = self._recent.get(id(obj))
        if hit is not None and hit[0] is obj:
            self.hits += 1
            return hit[1]
        record = self.convert(obj)
        self._recent[id(obj)] = (obj, record)
        if len(self._recent) > self.size:
            del self._recent[next(iter(self._recent))]
        return record


class RecordCache(_Cache[R, R]):
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

    def _out(self, entry: R) -> R:
        return entry

    def object(self, name: str, namespace: str = "") -> KubeObject | None:
        """The kept subset of the object, as JSON with its resourceVersion: the base of a
        merge patch sent with that resourceVersion as precondition."""
        record = self.get(name, namespace)
        return None if record is None else record.as_object()

    def _held_rv(self, entry: R) -> str:
        return entry.resource_version

    def _take(self, key: ObjectKey, obj: KubeObject, old: R | None) -> None:
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
        self._store(key, record)
        if record is not old and _differ(record, old):
            self._changed()

    def _forgotten(self, key: ObjectKey) -> None:
        self.unreadable.pop(key, None)

    def _cleared(self) -> None:
        self.unreadable.clear()


class _LastCompared:
    """The last two records compared and whether they differ (held, so that their
    identities stay theirs): the caches of a thousand clusters sharing Nodes each compare
    the same two records on every event (the record of the line before and the one of
    this line, each made once: :class:`Remembered`), so their fields are compared once."""

    __slots__ = ("differ", "new", "old")

    def __init__(self) -> None:
        self.old: object = None
        self.new: object = None
        self.differ = False

    def __call__(self, record: object, old: object) -> bool:
        if self.old is old and self.new is record:
            return self.differ
        differ = record != old
        self.old, self.new, self.differ = old, record, differ
        return differ


_differ = _LastCompared()


def unwrap(obj: Any) -> KubeObject | None:
    return obj if isinstance(obj, dict) else None
