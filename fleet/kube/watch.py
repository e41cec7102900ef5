"""List-then-watch with a finite, testable core and a forever wrapper.

``watch_once`` is one watch request: it yields events until the server closes the
stream and raises GoneError when the resourceVersion expired. ``Reflector`` keeps a
local store of a resource, re-lists on 410 Gone, reconnects with jittered backoff on
any transport failure, and tells its listener about every change (a re-list reports
the difference to the store as ordinary events, so listeners never miss a deletion).
A Reflector built with ``keep_objects=False`` keeps only each object's resourceVersion
(for that difference) and leaves the objects to its listener, which may keep less
(a :class:`~fleet.kube.cache.RecordCache`); a deletion found by a re-list then reports
the object's identity and last resourceVersion only.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import anyio

from fleet.kube.backoff import Backoff
from fleet.kube.client import KubeClient, KubeObject
from fleet.kube.errors import GoneError, KubeError, NotFoundError, WatchIdleError, from_status
from fleet.kube.resources import CRDS, Resource

if TYPE_CHECKING:
    from fleet.kube.wire import ObjectDecoder

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ObjectKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    object: KubeObject


def object_key(obj: KubeObject) -> ObjectKey:
    """``(namespace, name)``; the namespace interned (a handful of them name every one of
    thousands of cached objects: one string each, not one per key)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    return (sys.intern(ns) if type(ns) is str else ns, meta.get("name") or "")


async def watch_once(client: KubeClient, res: Resource, resource_version: str, *,
                     namespace: str | None = None, label_selector: str | None = None,
                     field_selector: str | None = None, timeout_seconds: int = 120,
                     read_timeout: float | None = None,
                     decoder: ObjectDecoder[Any] | None = None
                     ) -> AsyncIterator[WatchEvent | str]:
    """One watch request. Yields WatchEvents, and bookmark resourceVersions as str.
    ``decoder``: each event's object is only the subset it decodes (:mod:`fleet.kube.wire`;
    an object it does not take comes whole)."""
    stream = client.watch_lines(
        res, namespace, resource_version=resource_version, label_selector=label_selector,
        field_selector=field_selector, timeout_seconds=timeout_seconds,
        read_timeout=read_timeout if read_timeout is not None else timeout_seconds + 30,
        decoder=decoder,
    )
    async for raw in stream:
        item = watch_item(raw, res, resource_version)
        if item is not None:
            yield item


def watch_item(raw: Any, res: Resource, resource_version: str) -> WatchEvent | str | None:
    """What one decoded watch line says: a WatchEvent, a bookmark's resourceVersion (str;
    ``resource_version`` if it names none), or None (a type this ignores); raises the
    typed error of an ERROR event (:class:`GoneError` for 410)."""
    etype = raw.get("type")
    obj = raw.get("object") or {}
    if etype == "ERROR":
        raise from_status(int(obj.get("code") or 500), obj)
    if etype == "BOOKMARK":
        return str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
    if etype in ("ADDED", "MODIFIED", "DELETED"):
        if "kind" not in obj:
            obj["kind"] = res.kind
        if "apiVersion" not in obj:
            obj["apiVersion"] = res.api_version
        return WatchEvent(type=etype, object=obj)
    return None


def _established(crd: KubeObject) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or []
               if isinstance(c, dict))


async def crd_established(client: KubeClient, name: str, *, timeout_seconds: int = 120,
                          idle_timeout: float | None = None) -> bool:
    """Whether the CRD ``name`` (``<plural>.<group>``) is established, waiting for it on
    one watch of that CRD alone (up to ``timeout_seconds``) rather than polling: True as
    soon as it is, False when the watch ended without it."""
    selector = f"metadata.name={name}"
    listed = await client.list(CRDS, field_selector=selector)
    if any(_established(o) for o in listed.items):
        return True
    async for item in watch_once(client, CRDS, listed.resource_version,
                                 field_selector=selector, timeout_seconds=timeout_seconds,
                                 read_timeout=idle_timeout):
        if isinstance(item, WatchEvent) and item.type != "DELETED" and \
                _established(item.object):
            return True
    return False


Listener = Callable[[WatchEvent], Awaitable[None]]
# A listener that takes each event at once (a cache): called in the watch connection's
# own callback as the event's line arrives, so it must not block
Sink = Callable[[WatchEvent], None]


class Reflector:
    """A store of one resource kept current by list+watch, forever, until cancelled."""

    def __init__(self, client: KubeClient, res: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 listener: Listener | None = None, watch_timeout: int = 120,
                 backoff: Backoff | None = None,
                 on_health: Callable[[], None] | None = None,
                 keep_objects: bool = True,
                 relist_limiter: anyio.CapacityLimiter | None = None,
                 stop_when_absent: bool = False, spread: float = 0.2,
                 idle_timeout: float | None = None, page_size: int = 500,
                 versions: Callable[[], Mapping[ObjectKey, str]] | None = None,
                 decoder: ObjectDecoder[Any] | None = None,
                 sink: Sink | None = None) -> None:
        """``watch_timeout``: each watch request asks the server to end it after that
        many seconds, less a random part of up to ``spread`` of it (so that many watches
        opened at once do not re-open at once); the watch then resumes from the last
        resourceVersion it saw (events and bookmarks), one request, no list.
        ``idle_timeout``: how long a watch may say nothing at all (the API server sends a
        bookmark about every minute on a watch that allows them) before it is resumed as
        if the connection were dead; None: the watch's own timeout plus 30 s.
        ``versions`` (``keep_objects=False``): the resourceVersion of every object the
        listener holds of what this reflector lists (its only feeder for them), asked on
        a re-list instead of keeping a map of its own: for a hundred thousand objects the
        map's keys and versions were a second copy of what the listener's cache holds.
        ``decoder``: list items and watch events are decoded straight into the subset of
        each object the listener reads (:mod:`fleet.kube.wire`: the rest is skipped, not
        built as dicts); for a listener that keeps only that (a RecordCache).
        ``sink`` instead of ``listener``: a listener that takes each event at once and
        never waits (a cache's ``take_event``). It is handed every watch event as its line
        arrives (:meth:`KubeClient.watch_into`), without waking this reflector's task:
        a thousand watches of the same Nodes each woke a task, ran a stack of coroutines
        and async generators per event, and that was a third of an event's cost."""
        if listener is not None and sink is not None:
            raise ValueError("a Reflector has a listener or a sink, not both")
        self.client = client
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.listener = listener
        self.watch_timeout = watch_timeout
        self.spread = spread
        self.idle_timeout = idle_timeout
        self.backoff = backoff or Backoff(initial=0.2, maximum=10.0)
        self.store: dict[ObjectKey, KubeObject] = {}
        self.keep_objects = keep_objects
        # Shared by many reflectors: how many (full) lists are read and handed to the
        # listeners at once, which bounds the memory a start-up of many watches peaks at.
        self.relist_limiter = relist_limiter
        # objects per list request (keep_objects=False: each page handed on as it comes)
        self.page_size = page_size
        # Return from run() when the resource type stops being served (its CRD went),
        # after reporting every object deleted, instead of asking again with backoff.
        self.stop_when_absent = stop_when_absent
        # keep_objects=False: the resourceVersion of every object instead of the object
        self._versions: dict[ObjectKey, str] = {}
        self.versions = versions
        self.decoder = decoder
        self.sink = sink
        self.synced = anyio.Event()
        self.resource_version = ""
        self.relists = 0
        self.reconnects = 0
        self.watches = 0  # watch requests opened
        self.idle_resumes = 0  # watches resumed after saying nothing for idle_timeout
        # Health, for "is this API server answering?" and "is this task still turning?".
        self.last_activity = time.monotonic()  # last success *or* failure
        self.failing_since: float | None = None  # monotonic; None while requests succeed
        self.failing_since_wall: datetime | None = None
        self.last_error: str | None = None
        self.successes = 0
        self.absent = False  # the last list said the resource type is not served (404)
        self.on_health = on_health  # called on every failure and on the recovery after

    def _succeeded(self) -> None:
        self.last_activity = time.monotonic()
        self.successes += 1
        if self.failing_since is not None:
            log.info("%s: %s answering again", self.client.name, self.res)
            self.failing_since, self.failing_since_wall, self.last_error = None, None, None
            if self.on_health is not None:
                self.on_health()

    def _failed(self, error: Exception) -> None:
        self.last_activity = time.monotonic()
        if self.failing_since is None:
            self.failing_since, self.failing_since_wall = self.last_activity, datetime.now(UTC)
        self.last_error = str(error)
        if self.on_health is not None:
            self.on_health()

    def failing_for(self, now: float | None = None) -> float:
        """Seconds since list/watch requests started failing without a success (0: fine)."""
        if self.failing_since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.failing_since

    def items(self) -> list[KubeObject]:
        return list(self.store.values())

    def get(self, name: str, namespace: str = "") -> KubeObject | None:
        return self.store.get((namespace, name))

    async def _emit(self, event: WatchEvent) -> None:
        if self.sink is not None:
            self.sink(event)
        elif self.listener is not None:
            await self.listener(event)

    def _gone(self, key: ObjectKey, rv: str) -> KubeObject:
        """What a DELETED event reports of an object only its version was kept of."""
        meta = {"name": key[1], "resourceVersion": rv}
        if key[0]:
            meta["namespace"] = key[0]
        return {"apiVersion": self.res.api_version, "kind": self.res.kind, "metadata": meta}

    async def relist(self) -> None:
        if self.relist_limiter is None:
            await self._relist()
        else:
            async with self.relist_limiter:
                await self._relist()

    async def _relist(self) -> None:
        if not self.keep_objects:
            await self._relist_pages()
            return
        listed = await self.client.list(
            self.res, self.namespace, label_selector=self.label_selector,
            field_selector=self.field_selector, page_size=self.page_size,
            decoder=self.decoder,
        )
        fresh = {object_key(o): o for o in listed.items}
        if self.keep_objects:
            old_versions = {key: _rv(obj) for key, obj in self.store.items()}
            old_objects = self.store
            self.store = fresh
        else:
            old_versions, old_objects = self._versions, {}
            self._versions = {key: _rv(obj) for key, obj in fresh.items()}
        self.resource_version = listed.resource_version
        self.relists += 1
        self.absent = False
        self._succeeded()
        for key, rv in old_versions.items():
            if key not in fresh:
                await self._emit(WatchEvent("DELETED", old_objects.get(key)
                                            or self._gone(key, rv)))
        for key, obj in fresh.items():
            prev = old_versions.get(key)
            if prev is None:
                await self._emit(WatchEvent("ADDED", obj))
            elif prev != _rv(obj):
                await self._emit(WatchEvent("MODIFIED", obj))
        self.synced.set()

    async def _relist_pages(self) -> None:
        """A re-list that hands each page to the listener as it arrives (ADDED or
        MODIFIED), then reports what the list no longer holds (DELETED): the listener
        converts or drops a page's objects before the next is read, so a start-up of
        thousands of objects never holds all of them as JSON at once. A list that fails
        part-way has told the listener only of objects as they were at the list's
        snapshot; the next re-list compares against the versions known before it."""
        fresh: dict[ObjectKey, str] = {}
        rv = ""
        old_versions = self._versions if self.versions is None else dict(self.versions())
        async for page in self.client.list_pages(
                self.res, self.namespace, label_selector=self.label_selector,
                field_selector=self.field_selector, page_size=self.page_size,
                decoder=self.decoder):
            rv = page.resource_version or rv
            items = page.items
            del page
            items.reverse()  # popped from the end: in the server's order, each let go of
            while items:
                obj = items.pop()
                key, version = object_key(obj), _rv(obj)
                fresh[key] = version
                prev = old_versions.get(key)
                if prev is None:
                    await self._emit(WatchEvent("ADDED", obj))
                elif prev != version:
                    await self._emit(WatchEvent("MODIFIED", obj))
                del obj
        self._versions = fresh if self.versions is None else {}
        self.resource_version = rv
        self.relists += 1
        self.absent = False
        self._succeeded()
        for key, version in old_versions.items():
            if key not in fresh:
                await self._emit(WatchEvent("DELETED", self._gone(key, version)))
        self.synced.set()

    async def _absent(self, error: NotFoundError) -> None:
        if not self.absent:
            log.warning("%s: %s is not served (%s); treating it as empty until it is",
                        self.client.name, self.res, error)
        self.absent = True
        self._succeeded()  # the server answered
        old, self.store, self.resource_version = self.store, {}, ""
        versions, self._versions = self._versions, {}
        if self.versions is not None:
            versions = dict(self.versions())
        for obj in old.values():
            await self._emit(WatchEvent("DELETED", obj))
        for key, rv in versions.items():
            await self._emit(WatchEvent("DELETED", self._gone(key, rv)))
        self.synced.set()

    def _hold(self, event: WatchEvent) -> None:
        """The store's (or versions') side of a watch event."""
        obj = event.object
        rv = _rv(obj)
        if event.type == "DELETED":
            key = object_key(obj)
            self.store.pop(key, None)
            self._versions.pop(key, None)
        elif self.keep_objects:
            self.store[object_key(obj)] = obj
        elif self.versions is None:
            self._versions[object_key(obj)] = rv
        if rv:
            self.resource_version = rv

    async def _apply(self, event: WatchEvent) -> None:
        self._hold(event)
        await self._emit(event)

    def _take_line(self, raw: Any) -> None:
        """A sink's watch: one decoded line, taken in the connection's callback."""
        item = watch_item(raw, self.res, self.resource_version)
        if item is None:
            return
        if isinstance(item, str):
            self.resource_version = item
        else:
            self._hold(item)
            assert self.sink is not None
            self.sink(item)
        self.backoff.reset()
        self._succeeded()

    async def _watch(self, timeout: int) -> None:
        """One watch request, from the current resourceVersion, until the server ends it."""
        if self.sink is not None:
            await self.client.watch_into(
                self.res, self.namespace, self._take_line,
                resource_version=self.resource_version, label_selector=self.label_selector,
                field_selector=self.field_selector, timeout_seconds=timeout,
                read_timeout=self.idle_timeout if self.idle_timeout is not None
                else timeout + 30, decoder=self.decoder)
            return
        async for item in watch_once(
            self.client, self.res, self.resource_version, namespace=self.namespace,
            label_selector=self.label_selector, field_selector=self.field_selector,
            timeout_seconds=timeout, read_timeout=self.idle_timeout,
            decoder=self.decoder,
        ):
            if isinstance(item, str):
                self.resource_version = item
            else:
                await self._apply(item)
            self.backoff.reset()
            self._succeeded()

    async def run(self) -> None:
        """List (unless resuming from a known resourceVersion), then watch, forever."""
        need_list = not self.resource_version
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                timeout = max(1, int(self.watch_timeout
                                     * random.uniform(1.0 - self.spread, 1.0)))
                self.watches += 1
                await self._watch(timeout)
                self._succeeded()  # the server ended the watch normally
            except GoneError:
                log.info("%s: %s watch expired (410); re-listing", self.client.name, self.res)
                need_list = True
            except WatchIdleError as e:
                # Silent past its bound: resume from the last resourceVersion (if the
                # server is gone, that request fails and the failure path below runs).
                # Worth a warning: a server sends bookmarks about every minute, so this is
                # a dead connection or a server holding changes back (kubesim once did:
                # a rollout waited 150 s on a Node watch resumed here).
                self.idle_resumes += 1
                log.warning("%s: %s watch said nothing (no event, no bookmark) for %s; "
                            "resuming from resourceVersion %s (%s)", self.client.name,
                            self.res, "its timeout + 30 s" if self.idle_timeout is None
                            else f"{self.idle_timeout:g} s", self.resource_version, e)
            except NotFoundError as e:
                # The resource type is not served (its CRD is not installed): there are
                # no such objects, which is a synced, empty store - not a reason to wait
                # forever. Keep asking; when the CRD appears, the list fills the store.
                await self._absent(e)
                if self.stop_when_absent:
                    return
                need_list = True
                await anyio.sleep(self.backoff.next_delay())
            except KubeError as e:
                self.reconnects += 1
                self._failed(e)
                delay = self.backoff.next_delay()
                log.warning("%s: %s watch failed (%s); retrying in %.2fs",
                            self.client.name, self.res, e, delay)
                # After a failure the cached resourceVersion may be long gone; a fresh
                # list is cheap compared to missing changes, and answers at once whether
                # the server is back (an idle watch would not say so for minutes).
                need_list = True
                await anyio.sleep(delay)


def _rv(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
