"""KubeClient: one API server, plain-dict objects, over a chosen transport."""

from __future__ import annotations

import functools
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import yaml

from fleet.kube.errors import (
    FencedError,
    KubeError,
    NotFoundError,
    UnreachableError,
    retry_wait,
)
from fleet.kube.http import ConnectSlots
from fleet.kube.ratelimit import WriteLimiter
from fleet.kube.resources import Resource
from fleet.kube.transport import LineStream, Transport, TransportName

if TYPE_CHECKING:  # msgspec is imported only by who decodes with it (not the node agent)
    from fleet.kube.wire import ObjectDecoder

log = logging.getLogger(__name__)

KubeObject = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

# Connections the clients of :meth:`KubeClient.for_many` (a controller's workload
# clusters) open at once between them: a fleet's start-up opens thousands; enough at once
# for many WAN round trips in flight, few enough that no handshake starves past its
# deadline on a busy machine (they all did at 1000 clusters on 2 loaded cores).
MANY_CLIENTS_CONNECTING = ConnectSlots(100)


@dataclass(frozen=True, slots=True)
class ObjectList:
    items: list[KubeObject]
    resource_version: str
    # list_pages: where the next page starts (None: this was the last one)
    continue_token: str | None = None


@dataclass
class RequestCounts:
    """What happened on one connection, summed over every view of it."""

    retries_asked: int = 0


class KubeClient:
    """A client for one API server.

    Build it inside the running event loop (``await KubeClient.from_kubeconfig(...)``)
    and close it (``await client.close()`` or ``async with``). It never touches
    kubernetes-asyncio's global default configuration.
    """

    def __init__(self, api: Transport, *, name: str = "cluster",
                 write_fence: Callable[[], bool] | None = None,
                 reopen: Callable[[str], Awaitable[KubeClient]] | None = None,
                 write_limiter: WriteLimiter | None = None,
                 counts: RequestCounts | None = None) -> None:
        self._api = api
        self.name = name
        self._write_fence = write_fence
        self._reopen = reopen
        self.write_limiter = write_limiter
        # shared by every view of this connection (fenced(), limited())
        self.counts = counts if counts is not None else RequestCounts()

    @property
    def retries_asked(self) -> int:
        """GETs sent again on this connection, by any of its views, because the server
        said "try again after N s" (:func:`~fleet.kube.errors.retry_wait`)."""
        return self.counts.retries_asked

    def fenced(self, holds: Callable[[], bool]) -> KubeClient:
        """This client's connection, sending no write while ``holds()`` is false (a
        replica's writes under its Lease). Reads and watches are not fenced. Keeps this
        client's write limiter. Close the client it came from, not this one."""
        return KubeClient(self._api, name=self.name, write_fence=holds, reopen=self._reopen,
                          write_limiter=self.write_limiter, counts=self.counts)

    def limited(self, limiter: WriteLimiter | None) -> KubeClient:
        """This client's connection (and fence), each write first waiting for a token of
        ``limiter`` (:mod:`fleet.kube.ratelimit`; None: no limit). Reads and watches are
        not limited, nor is a client :meth:`reopen` builds from it (the Lease renewals').
        Close the client it came from, not this one."""
        return KubeClient(self._api, name=self.name, write_fence=self._write_fence,
                          reopen=self._reopen, write_limiter=limiter, counts=self.counts)

    async def reopen(self, *, name: str | None = None) -> KubeClient:
        """A new client for the same API server with the same credentials and TLS but
        connections of its own, built in (and for) the running event loop: the Lease
        renewals run on a thread of their own (fleet.controllers.renewal). It uses the
        ``light`` transport unless the credentials need ``generated``. It has no write
        fence and no write limiter (the renewals must not wait behind the controller's
        writes). Close it."""
        if self._reopen is None:
            raise KubeError(f"{self.name}: built without credentials to reopen with")
        return await self._reopen(name or self.name)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    async def from_kubeconfig(cls, kubeconfig: Mapping[str, Any], *, name: str = "cluster",
                              context: str | None = None,
                              transport: TransportName = "generated",
                              base_dir: Path | None = None,
                              connect_slots: ConnectSlots | None = None) -> KubeClient:
        """``transport``: ``generated`` (kubernetes-asyncio, every kubeconfig feature),
        ``light`` (small, for the node agent; see :mod:`fleet.kube.transport`) or ``auto``
        (``light`` unless the kubeconfig needs a feature only ``generated`` has: exec or
        auth-provider credentials, a proxy)."""
        async def again(other: str) -> KubeClient:  # reopen(): light if it can be
            return await cls.from_kubeconfig(kubeconfig, name=other, context=context,
                                             transport="auto", base_dir=base_dir)

        if transport in ("light", "auto"):
            from fleet.kube.light import (  # noqa: PLC0415
                LightTransport,
                NeedsGeneratedTransportError,
                credentials_from_kubeconfig,
            )

            try:
                creds = credentials_from_kubeconfig(kubeconfig, context=context,
                                                    base_dir=base_dir)
            except NeedsGeneratedTransportError:
                if transport == "light":
                    raise
            else:
                return cls(LightTransport(creds, name=name, connect_slots=connect_slots),
                           name=name, reopen=again)
        from fleet.kube.generated import GeneratedTransport  # noqa: PLC0415

        return cls(await GeneratedTransport.from_kubeconfig(kubeconfig, name=name,
                                                            context=context),
                   name=name, reopen=again)

    @classmethod
    async def for_many(cls, kubeconfig: Mapping[str, Any], *, name: str = "cluster",
                       context: str | None = None, allow_files: bool = False,
                       what: str | None = None) -> KubeClient:
        """A client for one of many clusters (the controller's workload clusters), from a
        kubeconfig someone other than the operator wrote (a Cluster API kubeconfig Secret):
        inline credentials only (:func:`fleet.kube.inline.check_inline`; ``allow_files``:
        the operator also allows file paths for it), else
        :class:`~fleet.kube.inline.KubeconfigNotAllowedError` naming the field (``what``
        starts its message). Always the ``light`` transport, never kubernetes-asyncio
        (which would run an exec plugin): its connections cost little, its SSL contexts
        are shared by clients with the same CA and identity, and it opens at most
        :data:`MANY_CLIENTS_CONNECTING` connections at once between them."""
        from fleet.kube.inline import check_inline  # noqa: PLC0415
        from fleet.kube.light import (  # noqa: PLC0415
            LightTransport,
            credentials_from_kubeconfig,
        )

        check_inline(kubeconfig, what=what or f"kubeconfig of {name}", allow_files=allow_files)
        creds = credentials_from_kubeconfig(kubeconfig, context=context)

        async def again(other: str) -> KubeClient:  # reopen(): the same checks again
            return await cls.for_many(kubeconfig, name=other, context=context,
                                      allow_files=allow_files, what=what)

        return cls(LightTransport(creds, name=name, connect_slots=MANY_CLIENTS_CONNECTING),
                   name=name, reopen=again)

    @classmethod
    async def from_kubeconfig_file(cls, path: str, *, name: str = "cluster",
                                   context: str | None = None,
                                   transport: TransportName = "generated") -> KubeClient:
        file = await anyio.Path(path).absolute()
        data = yaml.safe_load(await file.read_text(encoding="utf-8"))
        return await cls.from_kubeconfig(data, name=name, context=context,
                                         transport=transport, base_dir=Path(file.parent))

    @classmethod
    def in_cluster(cls, *, name: str = "management",
                   transport: TransportName = "generated") -> KubeClient:
        async def again(other: str) -> KubeClient:  # reopen(): light if it can be
            return cls.in_cluster(name=other, transport="auto")

        if transport in ("light", "auto"):
            from fleet.kube.light import LightTransport, in_cluster_credentials  # noqa: PLC0415

            return cls(LightTransport(in_cluster_credentials(), name=name), name=name,
                       reopen=again)
        from fleet.kube.generated import GeneratedTransport  # noqa: PLC0415

        return cls(GeneratedTransport.in_cluster(name=name), name=name, reopen=again)

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def host(self) -> str:
        return self._api.host

    # -- raw request -------------------------------------------------------------------------
    async def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout: float | None = 30.0,
                      decode: Callable[[bytes], Any] | None = None) -> Any:
        """``decode``: how the answer's body is read (default ``json.loads``); it raises
        ``ValueError`` for a body that is not what it reads."""
        if self.write_limiter is not None and method != "GET":
            # before the fence: the fence is asked when the write is about to be sent,
            # however long it waited for its turn
            await self.write_limiter.wait()
        if self._write_fence is not None and method != "GET" and not self._write_fence():
            raise FencedError(f"{self.name}: {method} {path} not sent: this replica's Lease "
                              "is not known to be held any more")
        query_params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        # A fence that knows how long its Lease is held (fleet.world.fence.WriteFence) bounds the
        # whole send: waiting for a connection, connecting and retrying all count.
        remaining = getattr(self._write_fence, "remaining", None) if method != "GET" else None
        if remaining is None:
            return await self._send(method, path, query_params, body=body,
                                    content_type=content_type, timeout=timeout, decode=decode)
        left = remaining()
        if left <= 0:
            raise FencedError(f"{self.name}: {method} {path} not sent: this replica's Lease "
                              "is not known to be held any more")
        with anyio.move_on_after(left) as scope:
            return await self._send(method, path, query_params, body=body,
                                    content_type=content_type, timeout=timeout, decode=decode)
        assert scope.cancelled_caught
        raise FencedError(f"{self.name}: {method} {path} not answered within the {left:.1f}s "
                          "this replica's Lease was still known to be held; given up (it may "
                          "or may not have been applied)")

    async def _send(self, method: str, path: str, query_params: list[tuple[str, str]], *,
                    body: Any, content_type: str, timeout: float | None,
                    decode: Callable[[bytes], Any] | None = None) -> Any:
        retries = 0
        # only a caller that asks for its own decoding needs a transport that offers it
        extra: dict[str, Any] = {} if decode is None else {"decode": decode}
        while True:
            try:
                return await self._api.call(method, path, query=query_params, body=body,
                                            content_type=content_type, timeout=timeout,
                                            **extra)
            except KubeError as e:
                wait = retry_wait(method, e, retries, random.random())
                if wait is None:
                    raise
                retries += 1
                self.counts.retries_asked += 1
                log.info("%s: GET %s: %s; again in %.1fs (the server asked)", self.name,
                         path, e, wait)
                await anyio.sleep(wait)

    async def open_stream(self, path: str, *, query: Mapping[str, Any],
                          read_timeout: float) -> LineStream:
        """Open a streaming GET (a watch); the caller reads lines and releases it."""
        query_params = [(k, _query_value(v)) for k, v in query.items() if v is not None]
        return await self._api.stream(path, query=query_params, read_timeout=read_timeout)

    # -- typed verbs -------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str | None = None,
                  *, subresource: str | None = None) -> KubeObject:
        return await self.request("GET", res.path(namespace, name, subresource))  # type: ignore[no-any-return]

    async def get_or_none(self, res: Resource, name: str,
                          namespace: str | None = None) -> KubeObject | None:
        try:
            return await self.get(res, name, namespace)
        except NotFoundError:
            return None

    async def list(self, res: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   page_size: int = 500, decoder: ObjectDecoder[Any] | None = None) -> ObjectList:
        """List all pages; the result's resource_version is where a watch continues."""
        items: list[KubeObject] = []
        rv = ""
        async for page in self.list_pages(res, namespace, label_selector=label_selector,
                                          field_selector=field_selector, page_size=page_size,
                                          decoder=decoder):
            items += page.items
            rv = page.resource_version or rv
        return ObjectList(items=items, resource_version=rv)

    async def list_pages(self, res: Resource, namespace: str | None = None, *,
                         label_selector: str | None = None,
                         field_selector: str | None = None,
                         page_size: int = 500,
                         resume: str | None = None,
                         decoder: ObjectDecoder[Any] | None = None) -> AsyncIterator[ObjectList]:
        """List page by page (``limit=page_size``), each page as it arrives: a caller
        that converts or drops each page's objects never holds the whole list. Every
        page is of the same snapshot; the last one's resource_version is where a watch
        continues. ``resume``: a page's ``continue_token`` of an earlier call with the
        same selectors, to go on from there (GoneError once the server no longer keeps
        that snapshot: list again from the start). ``decoder``: each item is decoded to
        the subset it keeps (:mod:`fleet.kube.wire`), never built whole as dicts (those
        it does not take are)."""
        cont: str | None = resume
        rv = ""
        decode = None
        if decoder is not None:
            from fleet.kube.wire import decode_list_page  # noqa: PLC0415

            decode = functools.partial(decode_list_page, decoder=decoder)
        while True:
            page = await self.request("GET", res.path(namespace), query={
                "labelSelector": label_selector, "fieldSelector": field_selector,
                "limit": page_size, "continue": cont,
            }, decode=decode)
            items: list[KubeObject] = []
            for item in page.get("items") or []:
                # list items omit kind/apiVersion; restore them so objects are self-describing
                item.setdefault("kind", res.kind)
                item.setdefault("apiVersion", res.api_version)
                items.append(item)
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            cont = meta.get("continue") or None
            del page
            yield ObjectList(items=items, resource_version=rv, continue_token=cont)
            if not cont:
                return

    async def create(self, res: Resource, body: KubeObject,
                     namespace: str | None = None) -> KubeObject:
        body = {"apiVersion": res.api_version, "kind": res.kind, **body}
        ns = namespace or (body.get("metadata") or {}).get("namespace")
        return await self.request("POST", res.path(ns if res.namespaced else None), body=body)  # type: ignore[no-any-return]

    async def create_subresource(self, res: Resource, name: str, subresource: str,
                                 body: KubeObject, namespace: str | None = None) -> Any:
        return await self.request("POST", res.path(namespace, name, subresource), body=body)

    async def patch(self, res: Resource, name: str, patch: Any, namespace: str | None = None,
                    *, content_type: str = MERGE_PATCH,
                    subresource: str | None = None) -> KubeObject:
        """Patch with an explicit content type (never guessed from the body's shape)."""
        return await self.request(  # type: ignore[no-any-return]
            "PATCH", res.path(namespace, name, subresource), body=patch,
            content_type=content_type,
        )

    async def replace(self, res: Resource, body: KubeObject, *,
                      subresource: str | None = None) -> KubeObject:
        meta = body["metadata"]
        return await self.request(  # type: ignore[no-any-return]
            "PUT", res.path(meta.get("namespace"), meta["name"], subresource), body=body
        )

    async def delete(self, res: Resource, name: str, namespace: str | None = None, *,
                     uid: str | None = None, resource_version: str | None = None,
                     propagation: str | None = None) -> Any:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        pre: dict[str, str] = {}
        if uid:
            pre["uid"] = uid
        if resource_version:
            pre["resourceVersion"] = resource_version
        if pre:
            body["preconditions"] = pre
        if propagation:
            body["propagationPolicy"] = propagation
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def server_version(self) -> dict[str, Any]:
        return await self.request("GET", "/version")  # type: ignore[no-any-return]

    async def _open_watch(self, res: Resource, namespace: str | None, *,
                          resource_version: str, label_selector: str | None,
                          field_selector: str | None, timeout_seconds: int,
                          read_timeout: float, decoder: ObjectDecoder[Any] | None
                          ) -> tuple[LineStream, Callable[[bytes], Any]]:
        resp = await self.open_stream(res.path(namespace), query={
            "watch": "true", "allowWatchBookmarks": "true",
            "resourceVersion": resource_version, "labelSelector": label_selector,
            "fieldSelector": field_selector, "timeoutSeconds": timeout_seconds,
        }, read_timeout=read_timeout)
        if decoder is None:
            read: Callable[[bytes], Any] = json.loads
        else:
            from fleet.kube.wire import decode_watch_line  # noqa: PLC0415

            read = functools.partial(decode_watch_line, decoder=decoder)
        name = self.name

        def decode(line: bytes) -> Any:
            # not stripped: both decoders skip the whitespace around the value, and a
            # copy of every (14 KB) line per watch is what it would cost
            try:
                return read(line)
            except json.JSONDecodeError as e:
                raise KubeError(f"{name}: undecodable watch line: {e}") from e

        return resp, decode

    async def watch_lines(self, res: Resource, namespace: str | None, *,
                          resource_version: str, label_selector: str | None,
                          field_selector: str | None, timeout_seconds: int,
                          read_timeout: float, decoder: ObjectDecoder[Any] | None = None
                          ) -> AsyncIterator[dict[str, Any]]:
        """One watch request, decoded; ends when the server closes the stream.
        ``decoder``: each event's object is decoded to the subset it keeps
        (:mod:`fleet.kube.wire`); without it, whole."""
        resp, decode = await self._open_watch(
            res, namespace, resource_version=resource_version,
            label_selector=label_selector, field_selector=field_selector,
            timeout_seconds=timeout_seconds, read_timeout=read_timeout, decoder=decoder)
        try:
            while True:
                try:
                    line = await resp.readline()
                except (TimeoutError, OSError) as e:
                    raise UnreachableError(f"{self.name}: watch {res}: {e!r}") from e
                if not line:
                    return
                if not line.isspace():
                    yield decode(line)
        finally:
            resp.release()

    async def watch_into(self, res: Resource, namespace: str | None,
                         take: Callable[[dict[str, Any]], None], *, resource_version: str,
                         label_selector: str | None, field_selector: str | None,
                         timeout_seconds: int, read_timeout: float,
                         decoder: ObjectDecoder[Any] | None = None) -> None:
        """One watch request, as :meth:`watch_lines`, but each decoded event handed to
        ``take`` as it arrives (on this client's own connections, in the connection's
        callback: ``take`` must not block); returns when the server ends the stream,
        raises what ``take`` raised."""
        resp, decode = await self._open_watch(
            res, namespace, resource_version=resource_version,
            label_selector=label_selector, field_selector=field_selector,
            timeout_seconds=timeout_seconds, read_timeout=read_timeout, decoder=decoder)

        def sink(line: bytes) -> None:
            if not line.isspace():
                take(decode(line))

        try:
            await resp.pour(sink)
        except (TimeoutError, OSError) as e:
            raise UnreachableError(f"{self.name}: watch {res}: {e!r}") from e
        finally:
            resp.release()


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
