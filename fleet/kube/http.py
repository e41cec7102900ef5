"""A small HTTP/1.1 client on asyncio streams: the light transport's wire.

Just what the node agent needs, so that it does not pay for a general HTTP library
(importing aiohttp costs ~20 MiB and ~0.2 s of CPU): one request at a time per
connection, keep-alive with a small idle pool, bodies framed by Content-Length, chunked
transfer coding or connection close, streamed to the caller (never buffered whole),
a deadline per read. No cookies, no compression (it asks for ``identity``), no proxies.

TLS runs over memory BIOs in :class:`_TlsProtocol` rather than asyncio's own TLS layer,
which allocates a 256 KiB read buffer per connection: at a thousand workload clusters
with three open watches each, that buffer alone would be most of the controller's memory.
Here a connection holds what it has received and not yet read, and at most one TLS
record (16 KiB) of decrypted data at a time.

Errors: :class:`HttpConnectionError` (could not connect, reset, TLS failure),
:class:`TruncatedBodyError` (the body ended before its framing said), :class:`TimeoutError`
(a read or connect deadline passed), :class:`HttpProtocolError` (an unreadable answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import weakref
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

_T = TypeVar("_T")

MAX_HEADER_BYTES = 64 * 1024
MAX_LINE_BYTES = 16 * 1024 * 1024  # one watch event (a large object) per line
TLS_READ_BYTES = 16 * 1024  # the most plaintext one TLS record carries


class HttpError(OSError):
    """The exchange failed below HTTP semantics."""


class HttpConnectionError(HttpError):
    """Could not connect, or the connection broke."""


class TruncatedBodyError(HttpError):
    """The connection ended before the whole body arrived."""


class HttpProtocolError(HttpError):
    """The server's answer was not HTTP/1.x as we understand it."""


class ConnectSlots:
    """How many connections the clients sharing it may be opening at once (TCP connect
    and TLS handshake), per event loop.

    A controller that starts with a thousand workload clusters opens about three
    connections to each at once; unbounded, the handshakes share the CPU (ours and the
    servers') so thinly that they outlast their connect deadline, fail together, and are
    retried together. Bounded, each gets through in its turn: time spent waiting for a slot
    is not part of the connect deadline."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"ConnectSlots needs at least one slot, got {size}")
        self.size = size
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                 asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._by_loop.get(loop)
        if sem is None:
            sem = self._by_loop[loop] = asyncio.Semaphore(self.size)
        return sem


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {url!r}")
        port = parts.port or (443 if scheme == "https" else 80)
        return cls(scheme, parts.hostname, port)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class _Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    async def wait_closed(self) -> None: ...


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class _TlsProtocol(asyncio.Protocol):
    """A TLS client connection over memory BIOs, decrypted data fed to a StreamReader
    (whose flow control pauses the socket when the reader falls behind)."""

    def __init__(self, context: ssl.SSLContext, server_hostname: str,
                 reader: asyncio.StreamReader) -> None:
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_hostname=server_hostname)
        self._reader = reader
        self._transport: asyncio.Transport | None = None
        self.handshake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A connect abandoned mid-handshake (its timeout, cancelled) closes the transport,
        # which fails this future with nobody awaiting it: mark its error as seen, or
        # asyncio logs "Future exception was never retrieved" for every such connect.
        self.handshake.add_done_callback(_retrieve)
        self._writable = asyncio.Event()
        self._writable.set()
        self._eof = False
        self._lost = asyncio.Event()

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._reader.set_transport(transport)
        self._step()

    def data_received(self, data: bytes) -> None:
        self._in.write(data)
        self._step()

    def eof_received(self) -> bool:
        self._end(None if self.handshake.done() else
                  ConnectionResetError("connection closed during the TLS handshake"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc if exc is not None or self.handshake.done() else
                  ConnectionResetError("connection closed during the TLS handshake"))
        self._writable.set()
        self._lost.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- TLS ------------------------------------------------------------------------------
    def _step(self) -> None:
        try:
            if not self.handshake.done():
                try:
                    self._ssl.do_handshake()
                except ssl.SSLWantReadError:
                    return
                finally:
                    self._flush()
                self.handshake.set_result(None)
            while not self._eof:
                try:
                    data = self._ssl.read(TLS_READ_BYTES)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:  # the server's close_notify
                    self._end(None)
                    break
                if not data:
                    self._end(None)
                    break
                self._reader.feed_data(data)
            self._flush()  # TLS 1.3 may answer (key updates)
        except (ssl.SSLError, ssl.CertificateError, OSError) as e:
            self._end(e)
            if self._transport is not None:
                self._transport.close()

    def _end(self, exc: BaseException | None) -> None:
        if not self.handshake.done():
            self.handshake.set_exception(exc or ConnectionResetError("TLS handshake ended"))
        if self._eof:
            return
        self._eof = True
        if exc is None:
            self._reader.feed_eof()
        else:
            self._reader.set_exception(exc if isinstance(exc, Exception) else
                                       ConnectionResetError(str(exc)))

    def _flush(self) -> None:
        if self._out.pending and self._transport is not None \
                and not self._transport.is_closing():
            self._transport.write(self._out.read())

    # -- the writer's side ----------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("TLS connection closed")
        self._ssl.write(data)
        self._flush()

    async def drain(self) -> None:
        await self._writable.wait()
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("TLS connection closed")

    def close(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        with contextlib.suppress(ssl.SSLError, OSError):
            self._ssl.unwrap()  # our close_notify (not waiting for the server's)
        with contextlib.suppress(Exception):
            self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    async def wait_closed(self) -> None:
        if self._transport is not None:
            await self._lost.wait()


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: _Writer) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass
class Response:
    """A response whose body is read on demand; ``release()`` when done with it."""

    status: int
    reason: str
    headers: dict[str, str]
    _conn: _Conn | None
    _pool: _Pool | None
    _read_timeout: float | None
    _remaining: int | None = None  # Content-Length left, when framed by it
    _chunked: bool = False
    _chunk_left: int = 0
    _eof: bool = False
    _buffer: bytearray = field(default_factory=bytearray)
    _reusable: bool = False

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    async def _timed(self, aw: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self._read_timeout):
                return await aw
        except asyncio.IncompleteReadError as e:
            raise TruncatedBodyError(
                f"connection closed {len(e.partial)} bytes into a read of {e.expected}") from None
        except (ConnectionError, ssl.SSLError) as e:
            raise HttpConnectionError(f"{type(e).__name__}: {e}") from e

    async def _read_raw(self, limit: int) -> bytes:
        """Up to ``limit`` body bytes, b"" at the end of the body."""
        if self._eof or self._conn is None:
            return b""
        reader = self._conn.reader
        if self._chunked:
            if self._chunk_left == 0:
                line = await self._timed(reader.readline())
                if not line:
                    raise TruncatedBodyError("connection closed before the next chunk")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise HttpProtocolError(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    while True:  # trailers, then the empty line
                        trailer = await self._timed(reader.readline())
                        if trailer in (b"\r\n", b"\n", b""):
                            break
                    self._finish(reusable=True)
                    return b""
                self._chunk_left = size
            data = await self._timed(reader.read(min(limit, self._chunk_left)))
            if not data:
                raise TruncatedBodyError(f"connection closed with {self._chunk_left} bytes "
                                         "of a chunk outstanding")
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                await self._timed(reader.readexactly(2))  # CRLF after the chunk
            return data
        if self._remaining is not None:
            if self._remaining == 0:
                self._finish(reusable=True)
                return b""
            data = await self._timed(reader.read(min(limit, self._remaining)))
            if not data:
                raise TruncatedBodyError(
                    f"connection closed with {self._remaining} bytes of the body outstanding")
            self._remaining -= len(data)
            if self._remaining == 0:
                self._finish(reusable=True)
            return data
        data = await self._timed(reader.read(limit))  # framed by connection close
        if not data:
            self._finish(reusable=False)
        return data

    async def read_chunk(self, limit: int = 256 * 1024) -> bytes:
        if self._buffer:
            out = bytes(self._buffer[:limit])
            del self._buffer[:limit]
            return out
        return await self._read_raw(limit)

    async def iter_chunks(self, limit: int = 256 * 1024) -> AsyncIterator[bytes]:
        while chunk := await self.read_chunk(limit):
            yield chunk

    async def readline(self) -> bytes:
        """One line of the body including its newline; b"" at the end."""
        while True:
            i = self._buffer.find(b"\n")
            if i >= 0:
                out = bytes(self._buffer[:i + 1])
                del self._buffer[:i + 1]
                return out
            if len(self._buffer) > MAX_LINE_BYTES:
                raise HttpProtocolError(f"a body line longer than {MAX_LINE_BYTES} bytes")
            data = await self._read_raw(64 * 1024)
            if not data:
                out = bytes(self._buffer)
                self._buffer.clear()
                return out
            self._buffer.extend(data)

    async def read(self, max_bytes: int = 512 * 1024 * 1024) -> bytes:
        out = bytearray()
        while chunk := await self.read_chunk():
            out.extend(chunk)
            if len(out) > max_bytes:
                raise HttpProtocolError(f"response body larger than {max_bytes} bytes")
        return bytes(out)

    def _finish(self, *, reusable: bool) -> None:
        self._eof = True
        self._reusable = reusable and self._reusable

    def release(self) -> None:
        """Give the connection back (when its body was read whole) or close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._eof and self._reusable and self._pool is not None:
            self._pool.put(conn)
        else:
            conn.close()


class _Pool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.idle: list[_Conn] = []

    def get(self) -> _Conn | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()
        return None

    def put(self, conn: _Conn) -> None:
        if len(self.idle) < self.size:
            self.idle.append(conn)
        else:
            conn.close()

    async def close(self) -> None:
        """Close every idle connection and wait (briefly) until each is closed, so
        that none outlives its event loop half-closed (a TLS close_notify in flight)."""
        conns, self.idle = self.idle, []
        for conn in conns:
            conn.close()
        for conn in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.writer.wait_closed(), 1.0)


class HttpClient:
    """Requests to one origin over a few kept-alive connections."""

    def __init__(self, base_url: str, *, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None, connect_timeout: float = 10.0,
                 pool_size: int = 32, unix_socket: str | None = None,
                 connect_slots: ConnectSlots | None = None) -> None:
        """``pool_size``: idle connections kept for reuse. The pool holds only what
        concurrent requests once opened (a workload cluster's client seldom more than one
        or two), but it must hold as many as a busy client keeps in flight: the
        controller's management client sends 16 writes at once, and with 4 kept the other
        12 each paid a TLS handshake and a close, per request, through a whole start-up.
        ``unix_socket``: connect to this socket instead (``base_url`` names the Host);
        ``connect_slots``: opening a connection waits for one of these (shared by many
        clients) before its ``connect_timeout`` starts."""
        self.origin = Origin.of(base_url)
        self.unix_socket = unix_socket
        self.base_path = urlsplit(base_url).path.rstrip("/")
        if self.origin.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self.ssl_context = ssl_context if self.origin.scheme == "https" else None
        self.server_hostname = server_hostname
        self.connect_timeout = connect_timeout
        self._pool = _Pool(pool_size)
        self.connect_slots = connect_slots

    async def _connect(self) -> _Conn:
        if self.connect_slots is None:
            return await self._open()
        async with self.connect_slots.semaphore():
            return await self._open()

    async def _open(self) -> _Conn:
        o = self.origin
        try:
            if self.unix_socket is not None:
                reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(
                    self.unix_socket, limit=MAX_HEADER_BYTES), self.connect_timeout)
                return _Conn(reader, writer)
            if self.ssl_context is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    o.host, o.port, limit=MAX_HEADER_BYTES), self.connect_timeout)
                return _Conn(reader, writer)
            return await asyncio.wait_for(self._connect_tls(self.ssl_context),
                                          self.connect_timeout)
        except TimeoutError:
            raise HttpConnectionError(
                f"connecting to {o.host}:{o.port}: no answer within {self.connect_timeout:g}s"
            ) from None
        except (OSError, ssl.SSLError) as e:
            raise HttpConnectionError(f"connecting to {o.host}:{o.port}: {e}") from e

    async def _connect_tls(self, context: ssl.SSLContext) -> _Conn:
        o = self.origin
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES, loop=loop)
        transport, proto = await loop.create_connection(
            lambda: _TlsProtocol(context, self.server_hostname or o.host, reader),
            o.host, o.port)
        try:
            await proto.handshake
        except BaseException:
            transport.close()
            raise
        return _Conn(reader, proto)

    async def request(self, method: str, target: str, *, headers: Mapping[str, str] | None = None,
                      body: bytes | None = None,
                      read_timeout: float | None = 30.0) -> Response:
        """Send one request; the response's body is left to read (then ``release()``).

        ``target`` is the path (and query) below the base URL. A kept-alive connection
        the server closed meanwhile is retried once on a fresh one (idempotent or not:
        a request that reached no server was never received).
        """
        for attempt in (1, 2):
            conn = self._pool.get()
            fresh = conn is None
            if conn is None:
                conn = await self._connect()
            try:
                return await self._exchange(conn, method, target, headers=headers, body=body,
                                            read_timeout=read_timeout)
            except (HttpConnectionError, TruncatedBodyError, asyncio.IncompleteReadError):
                conn.close()
                if fresh or attempt == 2:
                    raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Conn, method: str, target: str, *,
                        headers: Mapping[str, str] | None, body: bytes | None,
                        read_timeout: float | None) -> Response:
        lines = [f"{method} {self.base_path}{target} HTTP/1.1",
                 f"Host: {self.origin.host_header}", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            conn.writer.write(head + (body or b""))
            # Deadlines by asyncio.timeout, not wait_for: wait_for (Python 3.11) runs its
            # awaitable as a new task, one event-loop turn per header line even when the
            # line is already buffered; a thousand clusters' start-up is many requests.
            async with asyncio.timeout(read_timeout):
                await conn.writer.drain()  # a server not reading
            async with asyncio.timeout(read_timeout):
                status_line = await conn.reader.readline()
            if not status_line:
                raise HttpConnectionError("connection closed before the response")
            parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise HttpProtocolError(f"not an HTTP/1.x status line: {status_line[:60]!r}")
            status = int(parts[1])
            resp_headers: dict[str, str] = {}
            while True:
                async with asyncio.timeout(read_timeout):
                    line = await conn.reader.readline()
                if line in (b"\r\n", b"\n"):
                    break
                if not line:
                    raise HttpConnectionError("connection closed inside the response headers")
                name, _, value = line.decode("latin-1").partition(":")
                key = name.strip().lower()
                value = value.strip()
                resp_headers[key] = f"{resp_headers[key]}, {value}" \
                    if key in resp_headers else value
        except (ConnectionError, ssl.SSLError) as e:
            raise HttpConnectionError(f"{type(e).__name__}: {e}") from e
        except ValueError as e:
            raise HttpProtocolError(f"unreadable response: {e}") from e
        resp = Response(status=status, reason=parts[2] if len(parts) > 2 else "",
                        headers=resp_headers, _conn=conn, _pool=self._pool,
                        _read_timeout=read_timeout)
        keep = parts[0] == "HTTP/1.1" and "close" not in resp_headers.get("connection", "")
        resp._reusable = keep
        te = resp_headers.get("transfer-encoding", "").lower()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            resp._remaining = 0
        elif "chunked" in te:
            resp._chunked = True
        elif resp.content_length is not None:
            resp._remaining = resp.content_length
        else:
            resp._reusable = False  # body runs until the server closes
        if resp._remaining == 0:
            resp._finish(reusable=True)
        return resp

    async def close(self) -> None:
        await self._pool.close()
