"""Object caches fed by watches, and by the controller's own writes.

A Reflector tells the cache about every change it sees. The controller also tells it
about every object its own writes returned ("write-through"), so that the next planning
pass already sees what it just did, instead of re-deciding on a cache the watch has not
caught up with yet: without that, a pass right after a dispatch could dispatch again.
An object only ever moves forward: an event older than what the cache holds (by
resourceVersion) is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fleet.kube import KubeObject
from fleet.kube.watch import ObjectKey, WatchEvent, object_key

T = TypeVar("T")

Listener = Callable[[], None]
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


class ObjectCache:
    """Latest known version of every object of one resource (one API server)."""

    def __init__(self, kind: str, *, on_change: Listener | None = None,
                 on_object: ObjectListener | None = None) -> None:
        self.kind = kind
        self.on_object = on_object
        self._objects: dict[ObjectKey, KubeObject] = {}
        # Deleted objects' last resourceVersion, so a late event cannot resurrect them.
        self._tombstones: dict[ObjectKey, int] = {}
        self.on_change = on_change
        self.synced = False
        self.version = 0  # bumped on every change: cheap "did anything move?"
        self._memo: dict[tuple[ObjectKey, str], tuple[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def __iter__(self) -> Iterator[KubeObject]:
        return iter(list(self._objects.values()))

    def get(self, name: str, namespace: str = "") -> KubeObject | None:
        return self._objects.get((namespace, name))

    def items(self) -> list[KubeObject]:
        return list(self._objects.values())

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
        if len(self._memo) > 4 * len(self._objects) + 1024:
            live = {object_key(o) for o in self._objects.values()}
            self._memo = {k: v for k, v in self._memo.items() if k[0] in live}
        return value

    def _changed(self, obj: KubeObject | None = None) -> None:
        self.version += 1
        if self.on_object is not None:
            self.on_object(obj)
        if self.on_change is not None:
            self.on_change()

    def observe(self, obj: KubeObject | None) -> None:
        """An object as the API server returned it (watch event, or our own write)."""
        if not obj:
            return
        key = object_key(obj)
        rv = _rv(obj)
        tomb = self._tombstones.get(key)
        if tomb is not None and rv is not None and rv <= tomb:
            return
        if newer_or_same(obj, self._objects.get(key)):
            if self._objects.get(key) == obj:
                return
            self._objects[key] = obj
            self._tombstones.pop(key, None)
            self._changed(obj)

    def forget(self, obj: KubeObject) -> None:
        key = object_key(obj)
        old = self._objects.pop(key, None)
        rv = _rv(obj)
        if rv is not None:
            self._tombstones[key] = rv
            if len(self._tombstones) > 10_000:
                self._tombstones.pop(next(iter(self._tombstones)))
        if old is not None:
            self._changed(old)

    def clear(self) -> None:
        if self._objects:
            self._objects.clear()
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


def unwrap(obj: Any) -> KubeObject | None:
    return obj if isinstance(obj, dict) else None
