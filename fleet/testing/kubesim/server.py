"""The HTTP side of kubesim: many virtual clusters behind one TLS port.

Cluster ``c`` is served under ``https://127.0.0.1:<port>/clusters/c`` (its kubeconfig's
server URL; both of k0s-fleet's transports keep a server URL's path). Per cluster:
get, list (``limit``/``continue``, label and field selectors), watch (resume from a
resourceVersion, ``allowWatchBookmarks``, ``timeoutSeconds``, 410 Gone as an ERROR
event when the history no longer reaches back), create, update, patch (merge, JSON,
strategic merge, with the resourceVersion precondition a patch carries: real 409s),
delete (with preconditions), the ``status`` subresource and Pod ``eviction``. Resource
types not in :data:`~fleet.testing.kubesim.store.SERVED` answer 404 as an API server
without that CRD does (autopilot's ControlNodes and Plans); CustomResourceDefinitions
are served (none installed), so a client can watch for those CRDs to appear.

Requests need ``Authorization: Bearer <token>``. Every request is counted (cluster,
verb, resource): ``GET /kubesim/stats``, with the open watches and connections and how
late watches were sent their changes (``late_events``, ``late_max_seconds``: sent more
than 5 s after made; ``pending_oldest_seconds``: the oldest change not yet sent). Admin
calls, same token:
``POST /kubesim/compact/<cluster>`` forgets that cluster's watch history;
``GET /kubesim/standin`` reports what the node agent stand-in saw and did.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import time
from asyncio import sslproto
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from fleet.testing.kubesim.certs import ServingCert
from fleet.testing.kubesim.standin import NodeAgentStandIn
from fleet.testing.kubesim.store import (
    KINDS,
    ApiError,
    ClusterStore,
    Kind,
    Listener,
    Selection,
    Watcher,
    parse_field_selector,
    parse_label_selector,
)

log = logging.getLogger(__name__)

PREFIX = "/clusters/"
DEFAULT_WATCH_SECONDS = 1800
LATE_SECONDS = 5.0  # a change sent to a watch this long after it was made is reported
JSON_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Target:
    """What a request path names."""

    cluster: str
    kind: Kind
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_path(path: str) -> tuple[str, list[str]]:
    """``/clusters/<c>/api/...`` -> (c, the API path's segments)."""
    if not path.startswith(PREFIX):
        raise ApiError(404, "NotFound", f"no cluster in path {path!r} (expected "
                       f"{PREFIX}<cluster>/api/...)")
    cluster, _, rest = path[len(PREFIX):].partition("/")
    return cluster, [s for s in rest.split("/") if s]


def resolve(cluster: str, segs: list[str]) -> Target:
    if segs[:1] == ["api"] and len(segs) >= 3:
        group, version, rest = "", segs[1], segs[2:]
    elif segs[:1] == ["apis"] and len(segs) >= 4:
        group, version, rest = segs[1], segs[2], segs[3:]
    else:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    kind = KINDS.get((group, version, rest[0]))
    if kind is None or len(rest) > 3 or (namespace is not None and not kind.namespaced):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if sub not in (None, "status", "eviction") or (sub == "eviction" and kind.plural != "pods"):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if sub == "status" and not kind.has_status:
        raise ApiError(404, "NotFound", f"{kind.plural} have no status subresource")
    return Target(cluster, kind, namespace, name, sub)


def _error(e: ApiError) -> web.Response:
    return web.Response(status=e.code, body=json.dumps(e.status()).encode(),
                        content_type=JSON_TYPE)


class _Reply(web.Response):
    """A response that lets go of its body once sent. aiohttp's connection handler keeps
    a keep-alive connection's last response until the next one is done; the next request
    on a controller's connection is typically a watch that lasts minutes, after the list
    of the same objects (~140 KB per 10 Nodes) that would otherwise be held all along."""

    async def write_eof(self, data: bytes = b"") -> None:
        await super().write_eof(data)
        self.body = None


def _ok(raw: bytes, status: int = 200) -> web.Response:
    return _Reply(status=status, body=raw, content_type=JSON_TYPE)


TLS_RECORD_BYTES = 16 * 1024  # the most plaintext one TLS record carries


class _Tls(sslproto.SSLProtocol):
    """asyncio's TLS (server side) without its per-connection buffers, as kubesim holds
    three or four connections per workload cluster a controller replica watches.

    * Reads: asyncio allocates and zero-fills a 256 KiB read buffer per connection (0.75
      of the ~1.2 MiB per connected cluster measured before). A socket read is copied
      into the connection's incoming memory BIO right away (``get_buffer`` and
      ``buffer_updated`` run back to back in the selector loop's read callback), so every
      connection of one server (one event loop) shares one ``read_buffer``.
    * Writes: asyncio encrypts all it is given at once into the outgoing memory BIO,
      whose buffer never shrinks: a 140 KB list of 10 Nodes left 140 KB behind on the
      connection that carries the Node watch next. Here plaintext is encrypted one TLS
      record at a time, each handed to the socket before the next, so that BIO holds at
      most about one record (unless the peer stops reading: then as asyncio's does).

    The bytes on the wire are the same TLS records; only the size of each socket read
    and of each piece of plaintext handed to aiohttp (at most 16 KiB) is smaller. Built
    on CPython 3.11's ``asyncio.sslproto`` internals (``_ssl_buffer``, ``_do_write``),
    which the contract tests exercise (large lists and watches, 410s, restarts)."""

    max_size = TLS_RECORD_BYTES

    def __init__(self, loop: asyncio.AbstractEventLoop, app: asyncio.BaseProtocol,
                 context: ssl.SSLContext, read_buffer: bytearray) -> None:
        # No waiter (the server side has nobody to wake; asyncio accepts None there).
        super().__init__(loop, app, context, None,  # type: ignore[arg-type]
                         server_side=True)
        self._ssl_buffer = read_buffer
        self._ssl_buffer_view = memoryview(read_buffer)

    def _do_write(self) -> None:
        backlog: Any = self._write_backlog
        try:
            while backlog:
                data = backlog[0]
                view = data if isinstance(data, memoryview) else memoryview(data)
                count = self._sslobj.write(view[:TLS_RECORD_BYTES])  # type: ignore[attr-defined]
                if count < len(view):
                    backlog[0] = view[count:]
                else:
                    del backlog[0]
                self._write_buffer_size -= count
                self._process_outgoing()  # type: ignore[attr-defined]
        except (ssl.SSLWantReadError, ssl.SSLSyscallError):  # sslproto's SSLAgainErrors
            pass
        self._process_outgoing()  # type: ignore[attr-defined]


class _TlsSite(web.BaseSite):
    """A TCP site whose TLS is :class:`_Tls` (``web.TCPSite`` with ``ssl_context`` would
    take asyncio's own, with its 256 KiB buffer per connection)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 ssl_context: ssl.SSLContext, backlog: int) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        factory = self._runner.server
        ctx = self._ssl_context
        assert factory is not None and ctx is not None
        read_buffer = bytearray(TLS_RECORD_BYTES)  # shared: see _Tls

        def tls() -> asyncio.BaseProtocol:
            return _Tls(loop, factory(), ctx, read_buffer)

        self._server = await loop.create_server(tls, self._host, self._port,
                                                backlog=self._backlog, reuse_address=True)
        self._port = int(self._server.sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        return self._port


class KubeSim:
    """The virtual clusters and their HTTP server (an aiohttp application)."""

    def __init__(self, *, token: str, cert: ServingCert, port: int = 0,
                 history: int = 2000, bookmark_seconds: float = 60.0) -> None:
        self.token = token
        self.cert = cert
        self.port = port
        self.history = history
        self.bookmark_seconds = bookmark_seconds
        self.clusters: dict[str, ClusterStore] = {}
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self.listeners: list[Listener] = []
        self.standin: NodeAgentStandIn | None = None
        self._runner: web.AppRunner | None = None
        self._streams: dict[int, web.Request] = {}  # open watches, by id()
        # Watch delivery, for diagnosis (``/kubesim/stats``): changes written to their
        # watch more than LATE_SECONDS after they were made (a slow reader's back-pressure
        # counts too), and the longest such wait.
        self.late_events = 0
        self.late_max_seconds = 0.0

    # -- clusters ----------------------------------------------------------------------
    def add_cluster(self, name: str) -> ClusterStore:
        if not name or "/" in name:
            raise ValueError(f"cluster name {name!r} must be non-empty without '/'")
        if name not in self.clusters:
            self.clusters[name] = ClusterStore(name, history=self.history,
                                               on_change=self._changed)
        return self.clusters[name]

    def play_node_agents(self, step_seconds: float = 0.0) -> NodeAgentStandIn:
        """Let a stand-in answer every node request on this server's Nodes."""
        if self.standin is None:
            self.standin = NodeAgentStandIn(step_seconds=step_seconds)
            self.listeners.append(self.standin.on_change)
        return self.standin

    def _changed(self, cluster: str, store: ClusterStore, change: Any) -> None:
        for listener in self.listeners:
            listener(cluster, store, change)

    def url(self, cluster: str) -> str:
        return f"https://127.0.0.1:{self.port}{PREFIX}{cluster}"

    def kubeconfig(self, cluster: str, token: str | None = None) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": cluster, "cluster": {
                "server": self.url(cluster),
                "certificate-authority-data": base64.b64encode(self.cert.ca_pem).decode()}}],
            "users": [{"name": "admin", "user": {"token": token or self.token}}],
            "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "admin"}}],
            "current-context": cluster,
        }

    # -- serving -----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/kubesim/stats", self._stats)
        app.router.add_post("/kubesim/compact/{cluster}", self._compact)
        app.router.add_get("/kubesim/standin", self._standin)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert.cert, self.cert.key)
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = _TlsSite(self._runner, "127.0.0.1", self.port, ssl_context=ctx, backlog=1024)
        await site.start()
        self.port = site.port

    async def stop(self) -> None:
        """Stop serving as a killed API server does: every open watch connection is cut
        (not ended cleanly), nothing answers until ``start()``; the state is kept."""
        for request in list(self._streams.values()):
            if request.transport is not None:
                request.transport.abort()
        for store in self.clusters.values():
            store.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _stats(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(ApiError(401, "Unauthorized", "Unauthorized"))
        counts = [{"cluster": c, "verb": v, "resource": r, "count": n}
                  for (c, v, r), n in sorted(self.requests.items())]
        server = self._runner.server if self._runner is not None else None
        now = time.monotonic()
        pending = max((w.held(now) for store in self.clusters.values()
                       for w in store.watchers), default=0.0)
        return web.json_response({"requests": counts, "clusters": len(self.clusters),
                                  "watches": len(self._streams),
                                  "connections": len(server.connections) if server else 0,
                                  "late_events": self.late_events,
                                  "late_max_seconds": round(self.late_max_seconds, 3),
                                  "pending_oldest_seconds": round(pending, 3)})

    async def _standin(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(ApiError(401, "Unauthorized", "Unauthorized"))
        return web.json_response(self.standin.report() if self.standin else {})

    async def _compact(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(ApiError(401, "Unauthorized", "Unauthorized"))
        store = self.clusters.get(request.match_info["cluster"])
        if store is None:
            return _error(ApiError(404, "NotFound", "no such cluster"))
        return web.json_response({"compactedTo": store.compact()})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            if not self._authorized(request):
                raise ApiError(401, "Unauthorized", "Unauthorized")
            cluster, segs = parse_path(request.path)
            store = self.clusters.get(cluster)
            if store is None:
                raise ApiError(404, "NotFound", f"no virtual cluster {cluster!r} here")
            if segs in (["version"], ["healthz"], ["readyz"], ["livez"]):
                self.requests[(cluster, "get", segs[0])] += 1
                if segs == ["version"]:
                    return web.json_response({"major": "1", "minor": "31",
                                              "gitVersion": "v1.31.2+kubesim",
                                              "platform": "linux/amd64"})
                return web.Response(text="ok")
            target = resolve(cluster, segs)
            return await self._serve(request, store, target)
        except ApiError as e:
            return _error(e)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {e}") from None

    async def _serve(self, request: web.Request, store: ClusterStore,
                     t: Target) -> web.StreamResponse:
        q = request.query
        method = request.method
        ns = t.namespace or ""
        resource = t.kind.plural + (f"/{t.subresource}" if t.subresource else "")

        def count(verb: str) -> None:
            self.requests[(t.cluster, verb, resource)] += 1

        if method == "GET" and t.name is None:
            sel = Selection(t.kind, t.namespace, parse_label_selector(q.get("labelSelector")),
                            parse_field_selector(q.get("fieldSelector"), t.kind))
            if q.get("watch") in ("true", "1"):
                count("watch")
                return await self._watch(request, store, sel)
            count("list")
            try:
                limit = int(q.get("limit") or 0)
            except ValueError:
                raise ApiError(400, "BadRequest", "limit must be an integer") from None
            items, rv, cont, remaining = store.page(sel, limit, q.get("continue"))
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if cont:
                meta["continue"] = cont
                meta["remainingItemCount"] = remaining
            head = json.dumps({"kind": f"{t.kind.kind}List", "apiVersion": t.kind.api_version,
                               "metadata": meta}, separators=(",", ":"))
            return _ok(head[:-1].encode() + b',"items":[' + b",".join(o.raw for o in items)
                       + b"]}")
        if method == "GET":
            count("get")
            return _ok(store.get(t.kind, ns, t.name or "").raw)
        if method == "POST" and t.subresource == "eviction":
            count("create")
            store.delete(t.kind, ns, t.name or "")
            return web.json_response({"kind": "Status", "apiVersion": "v1",
                                      "status": "Success", "metadata": {}}, status=201)
        if method == "POST" and t.name is None:
            count("create")
            return _ok(store.create(t.kind, ns, await self._body(request)).raw, 201)
        if method == "PUT" and t.name:
            count("update")
            return _ok(store.replace(t.kind, ns, t.name, await self._body(request),
                                     t.subresource).raw)
        if method == "PATCH" and t.name:
            count("patch")
            ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
            return _ok(store.patch(t.kind, ns, t.name, content_type=ctype,
                                   patch=await self._body(request),
                                   subresource=t.subresource).raw)
        if method == "DELETE" and t.name:
            count("delete")
            body = await self._body(request)
            pre = body.get("preconditions") if isinstance(body, dict) else None
            gone = store.delete(t.kind, ns, t.name, pre if isinstance(pre, dict) else None)
            return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                      "status": "Success", "details": {
                                          "name": gone.name, "kind": t.kind.plural}})
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {request.path}")

    async def _watch(self, request: web.Request, store: ClusterStore,
                     sel: Selection) -> web.StreamResponse:
        q = request.query
        try:
            seconds = float(q.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        except ValueError:
            raise ApiError(400, "BadRequest", "timeoutSeconds must be a number") from None
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON_TYPE})
        await resp.prepare(request)
        try:
            watcher, backlog = store.watch(sel, q.get("resourceVersion") or "")
        except ApiError as e:
            # As the API server does: a 200 stream carrying one ERROR event.
            await resp.write(json.dumps({"type": "ERROR", "object": e.status()}).encode()
                             + b"\n")
            return resp
        self._streams[id(request)] = request
        try:
            for change in backlog:
                await resp.write(_event(change.type, change.obj.raw))
            await self._pump(resp, store, watcher, seconds=seconds, bookmarks=bookmarks)
        except ConnectionError:
            pass  # the client has gone: nobody to tell
        finally:
            store.unwatch(watcher)
            self._streams.pop(id(request), None)
        return resp

    async def _pump(self, resp: web.StreamResponse, store: ClusterStore, watcher: Watcher, *,
                    seconds: float, bookmarks: bool) -> None:
        """Send the watcher's changes as they come, a bookmark every ``bookmark_seconds``
        while nothing else is sent (if asked for), until ``seconds`` have passed.

        Whatever is pending is sent first, every turn; only then are the deadline and the
        bookmark looked at, and the wait for more is a wait on ``watcher.wakeup`` bounded
        by the next of them. (This was ``asyncio.wait_for(queue.get(), ...)``: a change
        queued in the same loop turn as the bookmark's timer fired stayed in the queue
        when the timed-out ``get`` was cancelled; the bookmark was then skipped for the
        non-empty queue and every later ``wait_for`` had no time left (the bookmark being
        due), so it cancelled its ``get`` before it ran: the watch sent nothing more until
        its deadline, spinning the loop. A workload cluster's Node watch in a 10 x 300
        rollout bench went silent that way for the client's 150 s idle bound.)"""
        kind = watcher.selection.kind
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        next_bookmark = loop.time() + self.bookmark_seconds

        def bookmark() -> bytes:
            return _event("BOOKMARK", json.dumps({
                "kind": kind.kind, "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(store.rv)}}).encode())

        while True:
            while watcher.pending:
                item = watcher.pending.popleft()
                if item is None:
                    return
                await resp.write(_event(item[1], item[2].raw))
                watcher.last_sent = time.monotonic()
                if watcher.last_sent - item[0] > LATE_SECONDS:
                    self._late(store, watcher, watcher.last_sent - item[0])
            now = loop.time()
            if now >= deadline:
                if bookmarks:
                    await resp.write(bookmark())
                return
            if bookmarks and now >= next_bookmark:
                await resp.write(bookmark())
                watcher.last_sent = time.monotonic()
                next_bookmark = loop.time() + self.bookmark_seconds
                continue
            # Nothing pending and nothing awaited since it was found so: a change queued
            # from here on sets the flag again.
            watcher.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(min(deadline, next_bookmark) if bookmarks
                                              else deadline):
                    await watcher.wakeup.wait()


    def _late(self, store: ClusterStore, watcher: Watcher, seconds: float) -> None:
        if not self.late_events or seconds > self.late_max_seconds:
            log.warning("cluster %s: a %s watch was sent a change %.1f s after it was made "
                        "(its client reading slowly, or the server holding it)", store.name,
                        watcher.selection.kind.plural, seconds)
        self.late_events += 1
        self.late_max_seconds = max(self.late_max_seconds, seconds)


def _event(etype: str, raw: bytes) -> bytes:
    return b'{"type":"' + etype.encode() + b'","object":' + raw + b"}\n"


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    tmp.rename(path)
