"""List-then-watch with a finite, testable core and a forever wrapper.

``watch_once`` is one watch request: it yields events until the server closes the
stream and raises GoneError when the resourceVersion expired. ``Reflector`` keeps a
local store of a resource, re-lists on 410 Gone, reconnects with jittered backoff on
any transport failure, and tells its listener about every change (a re-list reports
the difference to the store as ordinary events, so listeners never miss a deletion).
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import anyio

from fleet.kube.backoff import Backoff
from fleet.kube.client import KubeClient, KubeObject
from fleet.kube.errors import GoneError, KubeError, from_status
from fleet.kube.resources import Resource

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ObjectKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    object: KubeObject


def object_key(obj: KubeObject) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


async def watch_once(client: KubeClient, res: Resource, resource_version: str, *,
                     namespace: str | None = None, label_selector: str | None = None,
                     field_selector: str | None = None, timeout_seconds: int = 120,
                     read_timeout: float | None = None) -> AsyncIterator[WatchEvent | str]:
    """One watch request. Yields WatchEvents, and bookmark resourceVersions as str."""
    stream = client.watch_lines(
        res, namespace, resource_version=resource_version, label_selector=label_selector,
        field_selector=field_selector, timeout_seconds=timeout_seconds,
        read_timeout=read_timeout if read_timeout is not None else timeout_seconds + 30,
    )
    async for raw in stream:
        etype = raw.get("type")
        obj = raw.get("object") or {}
        if etype == "ERROR":
            raise from_status(int(obj.get("code") or 500), obj)
        if etype == "BOOKMARK":
            yield str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
            continue
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            obj.setdefault("kind", res.kind)
            obj.setdefault("apiVersion", res.api_version)
            yield WatchEvent(type=etype, object=obj)


Listener = Callable[[WatchEvent], Awaitable[None]]


class Reflector:
    """A store of one resource kept current by list+watch, forever, until cancelled."""

    def __init__(self, client: KubeClient, res: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 listener: Listener | None = None, watch_timeout: int = 120,
                 backoff: Backoff | None = None) -> None:
        self.client = client
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.listener = listener
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff(initial=0.2, maximum=10.0)
        self.store: dict[ObjectKey, KubeObject] = {}
        self.synced = anyio.Event()
        self.resource_version = ""
        self.relists = 0
        self.reconnects = 0

    def items(self) -> list[KubeObject]:
        return list(self.store.values())

    def get(self, name: str, namespace: str = "") -> KubeObject | None:
        return self.store.get((namespace, name))

    async def _emit(self, event: WatchEvent) -> None:
        if self.listener is not None:
            await self.listener(event)

    async def relist(self) -> None:
        listed = await self.client.list(
            self.res, self.namespace, label_selector=self.label_selector,
            field_selector=self.field_selector,
        )
        fresh = {object_key(o): o for o in listed.items}
        old = self.store
        self.store = fresh
        self.resource_version = listed.resource_version
        self.relists += 1
        for key, obj in old.items():
            if key not in fresh:
                await self._emit(WatchEvent("DELETED", obj))
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None:
                await self._emit(WatchEvent("ADDED", obj))
            elif _rv(prev) != _rv(obj):
                await self._emit(WatchEvent("MODIFIED", obj))
        self.synced.set()

    async def _apply(self, event: WatchEvent) -> None:
        key = object_key(event.object)
        if event.type == "DELETED":
            self.store.pop(key, None)
        else:
            self.store[key] = event.object
        rv = _rv(event.object)
        if rv:
            self.resource_version = rv
        await self._emit(event)

    async def run(self) -> None:
        """List (unless resuming from a known resourceVersion), then watch, forever."""
        need_list = not self.resource_version
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                timeout = int(self.watch_timeout * random.uniform(0.8, 1.0))
                async for item in watch_once(
                    self.client, self.res, self.resource_version, namespace=self.namespace,
                    label_selector=self.label_selector, field_selector=self.field_selector,
                    timeout_seconds=timeout,
                ):
                    if isinstance(item, str):
                        self.resource_version = item
                    else:
                        await self._apply(item)
                    self.backoff.reset()
            except GoneError:
                log.info("%s: %s watch expired (410); re-listing", self.client.name, self.res)
                need_list = True
            except KubeError as e:
                self.reconnects += 1
                delay = self.backoff.next_delay()
                log.warning("%s: %s watch failed (%s); retrying in %.2fs",
                            self.client.name, self.res, e, delay)
                # After a failure the cached resourceVersion may be long gone; a fresh
                # list is cheap compared to missing changes.
                need_list = need_list or not self.resource_version
                await anyio.sleep(delay)


def _rv(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
