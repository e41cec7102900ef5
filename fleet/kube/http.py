"""A small HTTP/1.1 client on asyncio streams: the light transport's wire.

Just what the node agent needs, so that it does not pay for a general HTTP library
(importing aiohttp costs ~20 MiB and ~0.2 s of CPU): one request at a time per
connection, keep-alive with a small idle pool, bodies framed by Content-Length, chunked
transfer coding or connection close, streamed to the caller (never buffered whole),
a deadline per read. No cookies, no compression (it asks for ``identity``).

The HTTP/1.1 framing is h11's (a maintained sans-I/O parser), not ours: lengths and
chunk sizes are digits only (``-1``, ``+0x10``, ``1_0`` are protocol errors), repeated
Content-Lengths must agree, and an answer's head is bounded (:data:`MAX_HEADER_BYTES`,
:data:`MAX_HEADERS`). Fields that must not be repeated with different values
(:data:`SINGLETON_FIELDS`) are refused when they are; others are joined with ", ".
Informational (1xx) answers are skipped. What a read returns is bounded by what the
caller asked for and what one socket read delivered. A request is sent again on a fresh
connection only when its pooled one failed before a byte of the answer arrived and the
request either never left or is idempotent (:data:`IDEMPOTENT`).

Proxies: an ``http://`` proxy (``proxy=``, or ``trust_env=True`` for ``HTTPS_PROXY`` /
``HTTP_PROXY`` / ``NO_PROXY``), through a CONNECT tunnel for https (TLS end to end) and
absolute-form requests for http.

TLS runs over memory BIOs in :class:`_TlsProtocol` rather than asyncio's own TLS layer,
which allocates a 256 KiB read buffer per connection: at a thousand workload clusters
with three open watches each, that buffer alone would be most of the controller's memory.
Here a connection holds what it has received and not yet read, and at most one TLS
record (16 KiB) of decrypted data at a time.

Errors: :class:`HttpConnectionError` (could not connect, reset, TLS failure, refused by
the proxy), :class:`TruncatedBodyError` (the body ended before its framing said),
:class:`TimeoutError` (a read or connect deadline passed), :class:`HttpProtocolError` (an
unreadable or out-of-bounds answer, or a request h11 would not send).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import h11

_T = TypeVar("_T")

MAX_HEADER_BYTES = 64 * 1024  # an answer's status line and header fields, together
MAX_HEADERS = 256  # header fields in one answer (a kube-apiserver sends about ten)
MAX_INFORMATIONAL = 16  # 1xx answers skipped before the final one
MAX_LINE_BYTES = 16 * 1024 * 1024  # one watch event (a large object) per line
TLS_READ_BYTES = 16 * 1024  # the most plaintext one TLS record carries
# a body read by lines: the socket is paused while more than twice this waits unread
LINE_BUFFER_BYTES = 256 * 1024
# the most ciphertext written into a connection's memory BIO at once (see data_received)
BIO_WRITE_BYTES = 17 * 1024
SOCKET_READ_BYTES = 64 * 1024  # the most one read of a TLS connection's socket brings


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


class _Feed(Protocol):
    """Where a connection's protocol puts what it received (an :class:`_Inbox`, or
    asyncio's StreamReader)."""

    def set_transport(self, transport: asyncio.BaseTransport) -> None: ...

    def feed_data(self, data: bytes) -> None: ...

    def feed_eof(self) -> None: ...

    def set_exception(self, exc: Exception) -> None: ...


class _Inbox:
    """What a connection received and its reader has not taken yet: the part of asyncio's
    StreamReader used here (``read``, ``at_eof``; the socket paused while more than
    twice ``limit`` waits unread), plus a line mode for streamed bodies.

    In line mode (:meth:`start_lines`, a :class:`Response` read by ``readline``) what
    arrives goes through the response's h11 parser as it arrives, in the protocol's
    callback, and the body's bytes gather in :attr:`_Lines.line`; the reader is woken only
    once a whole line (or the body's end, or an error) is there. A watch of a thousand
    clusters gets each event in two or three socket reads (a kube-apiserver's TLS records
    of one chunk): woken per read, each watch's whole stack of coroutines ran for every
    piece. Its idle deadline (no byte for ``timeout`` seconds while the reader waits) is
    one timer per connection, moved on only when it fires, instead of a timer per read."""

    def __init__(self, limit: int = MAX_HEADER_BYTES) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._eof = False
        self._exception: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._paused = False
        self.lines: _Lines | None = None
        # the idle deadline of line mode
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        self._idle: float | None = None
        self._since = 0.0  # the reader waits since
        self._fed_at = 0.0
        self._timed_out = False

    # -- the protocol's side ---------------------------------------------------------------
    def set_transport(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def feed_data(self, data: bytes) -> None:
        if not data:
            return
        lines = self.lines
        if lines is None:
            self._buffer += data
            self._wake()
            if not self._paused and len(self._buffer) > 2 * self._limit:
                self._pause()
            return
        if self._loop is not None:
            self._fed_at = self._loop.time()
        if lines.feed(data) and self._waiter is not None:
            self._wake()
        # (a reader waiting still lacks a line: the socket stays open for it)
        elif not self._paused and self._waiter is None \
                and len(lines.line) > 2 * LINE_BUFFER_BYTES:
            self._pause()

    def feed_eof(self) -> None:
        self._eof = True
        if self.lines is not None:
            self.lines.feed(b"", eof=True)
        self._wake()

    def set_exception(self, exc: Exception) -> None:
        self._exception = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _pause(self) -> None:
        if isinstance(self._transport, asyncio.ReadTransport):
            with contextlib.suppress(RuntimeError, AttributeError):
                self._transport.pause_reading()
                self._paused = True

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if isinstance(self._transport, asyncio.ReadTransport):
                with contextlib.suppress(RuntimeError, AttributeError):
                    self._transport.resume_reading()

    # -- the reader's side -----------------------------------------------------------------
    def exception(self) -> Exception | None:
        return self._exception

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    async def _wait(self) -> None:
        if self._waiter is not None:
            raise RuntimeError("two readers of one connection")
        self._resume()  # the reader wants more: never wait on a paused socket
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        waiter = self._waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def _until_data(self) -> None:
        """Until something is here to read, or the end; raises the connection's error."""
        if self._exception is not None:
            raise self._exception
        while not self._buffer and not self._eof:
            await self._wait()
            if self._exception is not None:
                raise self._exception

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (b"": the end of the stream), as ``StreamReader.read``."""
        await self._until_data()
        data = bytes(memoryview(self._buffer)[:n])
        del self._buffer[:n]
        if self._paused and len(self._buffer) <= self._limit:
            self._resume()
        return data

    async def read_head(self, n: int) -> bytes:
        """As :meth:`read`, but never past the first blank line (the end of an answer's
        head, as h11 finds it): its parser then holds none of the body."""
        await self._until_data()
        match = _BLANK_LINE.search(self._buffer, 0, n)
        return await self.read(match.end() if match is not None else n)

    def start_lines(self, parser: h11.Connection, taken: bytearray, *,
                    chunked: bool) -> _Lines:
        """Into line mode for the body ``parser`` is reading: ``taken`` is what the reader
        already has of it, the bytes waiting here are parsed now. ``chunked``: the
        answer's head said so (then plain chunks are read without h11 as long as h11
        holds none of the body: see :class:`_Lines`)."""
        fast = chunked and parser.their_state is h11.SEND_BODY \
            and parser.their_http_version == b"1.1" and not parser.trailing_data[0]
        lines = self.lines = _Lines(parser, taken, fast=fast)
        pending, self._buffer = self._buffer, bytearray()
        lines.feed(bytes(pending), eof=self._eof)
        return lines

    def stop_lines(self) -> None:
        self.lines = None
        self.close()  # its idle deadline goes with it
        self._idle = None
        self._timed_out = False
        self._resume()

    def taken(self) -> None:
        """The reader took a line."""
        if self._paused and self.lines is not None \
                and len(self.lines.line) <= LINE_BUFFER_BYTES:
            self._resume()

    async def wait_lines(self, timeout: float | None) -> None:
        """Until more of the body is here; TimeoutError when nothing at all arrived for
        ``timeout`` seconds while waiting."""
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        if timeout is not None:
            self._idle = timeout
            self._since = now = loop.time()
            due = now + timeout
            if self._timer is None or self._timer_due > due:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer, self._timer_due = loop.call_at(due, self._check_idle), due
        else:
            self._idle = None
        await self._wait()
        if self._timed_out:
            self._timed_out = False
            raise TimeoutError(f"nothing read for {timeout:g}s")

    def _check_idle(self) -> None:
        self._timer = None
        waiter, idle, loop = self._waiter, self._idle, self._loop
        if waiter is None or waiter.done() or idle is None or loop is None \
                or self.lines is None:
            return  # re-armed by the next wait for lines
        due = max(self._since, self._fed_at) + idle
        if loop.time() >= due:
            self._timed_out = True
            self._wake()
        else:
            self._timer, self._timer_due = loop.call_at(due, self._check_idle), due

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# A chunk header the line mode reads itself: hex digits only (at most 8), CRLF. Anything
# else (the last chunk, extensions, whitespace, a malformed header) is h11's to read.
_PLAIN_CHUNK_HEADER = re.compile(rb"[0-9A-Fa-f]{1,8}\r\n")
_CHUNK_HEADER_PROBE = 10  # bytes a plain chunk header takes at most
_BLANK_LINE = re.compile(rb"\n\r?\n")  # the end of a head (h11's blank_line_regex)


class _Lines:
    """A body read line by line (:class:`_Inbox`'s line mode): what arrives is parsed at
    once, and ``line`` gathers the body's bytes not yet read; ``end`` says how the body
    ended (None: not yet; True/False: the connection reusable or not), ``error`` why it
    cannot be read further.

    h11 is the parser of record. A chunked body (a watch) is the exception, for its
    plainest chunks only: a thousand watch connections each parsing every 14 KB event in
    h11 cost more CPU than decrypting it (~20 us a chunk, three times that when a
    kube-apiserver's chunk comes in three TLS records). So from the head on (when h11
    holds none of the body yet, ``fast``) chunks whose header is exactly hex digits and
    CRLF are taken here: the data, then exactly CRLF, else the body is unreadable
    ("malformed chunk footer", as h11 says it). At the first chunk header that is not
    that plain (the last chunk, whose trailers and end h11 reads; an extension; anything
    malformed) the rest of the stream goes to h11 from that chunk on, which reads it
    exactly as if it had read the body from its start: the plain chunks it did not see
    are ones it reads the same way."""

    __slots__ = ("end", "error", "fast", "head", "left", "line", "parser", "scan", "sink",
                 "tail")

    def __init__(self, parser: h11.Connection, taken: bytearray, *, fast: bool) -> None:
        self.parser = parser
        self.line = taken
        self.scan = 0  # no newline in line[:scan]
        self.end: bool | None = None
        # why the body cannot be read further: the wire's error (an HttpError), or what
        # the sink raised
        self.error: Exception | None = None
        # poured (:meth:`Response.pour`): each whole line is handed to it as it arrives
        self.sink: Callable[[bytes], None] | None = None
        self.fast = fast
        self.left = 0  # fast: bytes of the current chunk's data still to come
        self.tail = 0  # fast: bytes of the current chunk's CRLF still to come
        self.head = b""  # fast: the start of a chunk header

    def feed(self, data: bytes, *, eof: bool = False) -> bool:
        """Parse ``data`` (``eof``: then the stream ended; nothing: what the parser holds
        already); whether the reader has something new to take: a whole line, the end,
        an error."""
        if self.end is not None or self.error is not None:
            if data:
                self.parser.receive_data(data)  # after the body: trailing data, as before
            return False
        if data and eof:  # what came before the end is read before the end is told
            fed = self.feed(data)
            return self.feed(b"", eof=True) or fed
        start = len(self.line)
        if self.fast:
            data = self._plain_chunks(data, eof)
            if self.error is not None:
                return True
            if self.fast:
                if self.sink is not None:
                    return self.pour()
                return self.line.find(b"\n", start) >= 0 or len(self.line) > MAX_LINE_BYTES
        parser = self.parser
        if data:
            parser.receive_data(data)
        if eof:
            parser.receive_data(b"")
        line = self.line
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as e:
                if parser.their_state is h11.ERROR and parser.trailing_data[1]:
                    self.error = TruncatedBodyError(f"connection closed inside the body: {e}")
                else:
                    self.error = _protocol_error(e)
                return True
            if event is h11.NEED_DATA:
                break
            if type(event) is h11.Data:
                line += event.data
                continue
            if type(event) is h11.EndOfMessage:
                self.end = parser.our_state is h11.DONE and parser.their_state is h11.DONE
            else:  # PAUSED, ConnectionClosed, ...: the answer is over, the connection unfit
                self.end = False
            if self.sink is not None:
                self.pour()
            return True
        if self.sink is not None:
            return self.pour()
        return line.find(b"\n", start) >= 0 or len(line) > MAX_LINE_BYTES

    def pour(self) -> bool:
        """Hand each whole line gathered to :attr:`sink` (in order; what it raises stops
        the pouring and becomes :attr:`error`); whether the reader must be woken: an
        error, or a line longer than :data:`MAX_LINE_BYTES` still without its end."""
        sink = self.sink
        if sink is None or self.error is not None:
            return self.error is not None
        line = self.line
        i = line.find(b"\n", self.scan)
        if i < 0:
            self.scan = len(line)
            return len(line) > MAX_LINE_BYTES
        start = 0
        view = memoryview(line)
        try:
            while i >= 0:
                piece = bytes(view[start:i + 1])
                start = i + 1
                sink(piece)
                i = line.find(b"\n", start)
        except Exception as e:  # the reader raises it
            self.error = e
            return True
        finally:
            view.release()
            del line[:start]
            self.scan = len(line)
        return len(line) > MAX_LINE_BYTES

    def _plain_chunks(self, data: bytes, eof: bool) -> bytes:
        """Take the plain chunks of ``data``; what h11 is to read from here on, once a
        chunk header is not plain (then ``fast`` is False), else b"" (all taken)."""
        line = self.line
        n = len(data)
        pos = 0
        view = memoryview(data)
        while pos < n:
            if self.left:
                take = min(self.left, n - pos)
                line += view[pos:pos + take]
                pos += take
                self.left -= take
                if not self.left:
                    self.tail = 2
                continue
            if self.tail:
                expected = b"\r\n"[2 - self.tail:]
                got = data[pos:pos + len(expected)]
                if got != expected[:len(got)]:
                    self.error = _protocol_error(h11.RemoteProtocolError(
                        f"malformed chunk footer: {got!r} (expected {expected!r})"))
                    self.fast = False  # (not read further)
                    return b""
                pos += len(got)
                self.tail -= len(got)
                continue
            # a chunk header, perhaps begun in an earlier piece
            probe = self.head + data[pos:pos + _CHUNK_HEADER_PROBE - len(self.head)]
            end = probe.find(b"\n")
            if end < 0 and len(probe) < _CHUNK_HEADER_PROBE and pos + len(probe) \
                    - len(self.head) >= n:
                self.head = probe  # the header goes on in the next piece
                pos = n
                break
            header = probe[:end + 1]
            if end < 0 or not _PLAIN_CHUNK_HEADER.fullmatch(header) \
                    or int(header[:-2], 16) == 0:
                self.fast = False  # h11 reads on from this header
                rest = self.head + data[pos:]
                self.head = b""
                return rest
            pos += len(header) - len(self.head)
            self.head = b""
            self.left = int(header[:-2], 16)
        if eof:
            if self.left or self.tail:
                self.error = TruncatedBodyError(
                    "connection closed inside the body: peer closed connection without "
                    "sending complete message body (incomplete chunked read)")
                self.fast = False
                return b""
            self.fast = False  # at a chunk boundary: h11 says what the end means
            rest, self.head = self.head, b""
            return rest
        return b""


class _Connection(asyncio.Protocol):
    """What both connection protocols share: the writer's flow control (``drain`` waits
    while asyncio has paused writing) and the wait for the connection's end."""

    _closed = "connection closed"  # what a write or drain on a closed one raises

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = asyncio.Event()

    def _gone(self) -> None:
        """The connection ended: no writer waits for it any more."""
        self._writable.set()
        self._lost.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drain(self) -> None:
        await self._writable.wait()
        if self.is_closing():
            raise ConnectionResetError(self._closed)

    def is_closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    async def wait_closed(self) -> None:
        if self._transport is not None:
            await self._lost.wait()


class _TlsProtocol(_Connection):
    """A TLS client connection over memory BIOs, decrypted data fed to a StreamReader
    (whose flow control pauses the socket when the reader falls behind)."""

    _closed = "TLS connection closed"

    def __init__(self, context: ssl.SSLContext, server_hostname: str,
                 reader: _Feed) -> None:
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_hostname=server_hostname)
        super().__init__()
        self._reader = reader
        self.handshake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A connect abandoned mid-handshake (its timeout, cancelled) closes the transport,
        # which fails this future with nobody awaiting it: mark its error as seen, or
        # asyncio logs "Future exception was never retrieved" for every such connect.
        self.handshake.add_done_callback(_retrieve)
        self._eof = False

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        # asyncio's socket transports read up to 256 KiB at once (``max_size``): once the
        # event loop falls behind, each of a thousand watch connections then holds a
        # quarter MiB read, as much again decrypted, and glibc maps and unmaps each such
        # block (the resident size swung by 100+ MiB a second, issue 33). 64 KiB reads
        # stay in the heap and bound what one connection brings in at once.
        if getattr(transport, "max_size", 0) > SOCKET_READ_BYTES:
            transport.max_size = SOCKET_READ_BYTES  # type: ignore[attr-defined]
        self._transport = transport
        self._reader.set_transport(transport)
        self._step()

    def data_received(self, data: bytes) -> None:
        # Into the memory BIO a TLS record's worth at a time, decrypted in between:
        # OpenSSL's memory BIO keeps the largest buffer it ever held, and one socket read
        # brings up to 256 KiB (asyncio's read size) once the event loop fell behind: a
        # thousand watch connections kept 250 MiB for good after one burst of Node events
        # (bench/README.md, issue 33).
        if len(data) <= BIO_WRITE_BYTES:
            self._in.write(data)
            self._step()
            return
        view = memoryview(data)
        for start in range(0, len(view), BIO_WRITE_BYTES):
            self._in.write(view[start:start + BIO_WRITE_BYTES])
            self._step()

    def eof_received(self) -> bool:
        self._end(None if self.handshake.done() else
                  ConnectionResetError("connection closed during the TLS handshake"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc if exc is not None or self.handshake.done() else
                  ConnectionResetError("connection closed during the TLS handshake"))
        self._gone()

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
                # Nothing received that is not read yet, nothing decrypted that is not
                # handed on: no read. (The read would raise SSLWantReadError, which cost
                # a watch connection about as much as the rest of this step.)
                if not self._in.pending and not self._ssl.pending():
                    break
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
            raise ConnectionResetError(self._closed)
        self._ssl.write(data)
        self._flush()

    def close(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        with contextlib.suppress(ssl.SSLError, OSError):
            self._ssl.unwrap()  # our close_notify (not waiting for the server's)
        with contextlib.suppress(Exception):
            self._flush()
        self._transport.close()


class _PlainProtocol(_Connection):
    """A connection without TLS, what it receives fed to an :class:`_Inbox` (the
    writer's side as :class:`_TlsProtocol`'s)."""

    def __init__(self, reader: _Feed) -> None:
        super().__init__()
        self._reader = reader

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._reader.set_transport(transport)

    def data_received(self, data: bytes) -> None:
        self._reader.feed_data(data)

    def eof_received(self) -> bool:
        self._reader.feed_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._reader.feed_eof()
        else:
            self._reader.set_exception(exc)
        self._gone()

    def write(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError(self._closed)
        self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# Fields whose repetition with different values changes what the answer means: refused
# rather than joined (other repeated fields are joined with ", " as RFC 9110 allows).
SINGLETON_FIELDS = frozenset({"content-length", "content-type", "content-range", "location",
                              "retry-after", "etag", "last-modified"})


class _NoAnswerError(HttpConnectionError):
    """The connection failed before a byte of the answer arrived. ``sent``: whether any
    of the request may have reached the server (False: it surely did not)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Reader(Protocol):
    async def read(self, n: int) -> bytes: ...

    def at_eof(self) -> bool: ...


class _Conn:
    def __init__(self, reader: _Reader, writer: _Writer) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)

    def close(self) -> None:
        if isinstance(self.reader, _Inbox):
            self.reader.close()
        with contextlib.suppress(Exception):
            self.writer.close()


def _protocol_error(e: h11.ProtocolError) -> HttpProtocolError:
    return HttpProtocolError(f"unreadable response: {e}")


@dataclass
class Response:
    """A response whose body is read on demand; ``release()`` when done with it."""

    status: int
    reason: str
    headers: dict[str, str]
    _conn: _Conn | None
    _pool: _Pool | None
    _read_timeout: float | None
    _eof: bool = False
    _buffer: bytearray = field(default_factory=bytearray)
    _reusable: bool = False
    _lines: _Lines | None = None  # read by lines in the inbox's line mode

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        # h11 has checked it is digits (and that repetitions agree)
        return int(value) if value is not None and value.isascii() and value.isdigit() \
            else None

    async def _timed(self, aw: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self._read_timeout):
                return await aw
        except (ConnectionError, ssl.SSLError) as e:
            raise HttpConnectionError(f"{type(e).__name__}: {e}") from e

    async def _read_raw(self, limit: int) -> bytes:
        """Body bytes, b"" at the end of the body: at most ``max(limit, what the head's
        read brought along)``, never more than the connection delivered in one read."""
        if self._eof or self._conn is None:
            return b""
        conn = self._conn
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError as e:
                self._finish(reusable=False)
                if conn.h11.their_state is h11.ERROR and conn.h11.trailing_data[1]:
                    raise TruncatedBodyError(f"connection closed inside the body: {e}") from None
                raise _protocol_error(e) from None
            if event is h11.NEED_DATA:
                data = await self._timed(conn.reader.read(max(limit, 1)))
                conn.h11.receive_data(data)  # b"": the end of the stream
                continue
            if isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
                continue
            if isinstance(event, h11.EndOfMessage):
                self._finish(reusable=conn.h11.our_state is h11.DONE
                             and conn.h11.their_state is h11.DONE)
                return b""
            # PAUSED, ConnectionClosed or anything else: this answer is over, and the
            # connection is not fit for another.
            self._finish(reusable=False)
            return b""

    async def read_chunk(self, limit: int = 256 * 1024) -> bytes:
        if not self._buffer:
            data = await self._read_raw(limit)
            if len(data) <= limit:
                return data
            self._buffer.extend(data)
        out = bytes(self._buffer[:limit])
        del self._buffer[:limit]
        return out

    async def iter_chunks(self, limit: int = 256 * 1024) -> AsyncIterator[bytes]:
        while chunk := await self.read_chunk(limit):
            yield chunk

    async def readline(self) -> bytes:
        """One line of the body including its newline; b"" at the end."""
        conn = self._conn
        if conn is not None and not self._eof and isinstance(conn.reader, _Inbox):
            return await self._readline_fed(conn, conn.reader)
        start = 0
        while True:
            i = self._buffer.find(b"\n", start)
            if i >= 0:
                out = bytes(self._buffer[:i + 1])
                del self._buffer[:i + 1]
                return out
            if len(self._buffer) > MAX_LINE_BYTES:
                raise HttpProtocolError(f"a body line longer than {MAX_LINE_BYTES} bytes")
            start = len(self._buffer)
            data = await self._read_raw(64 * 1024)
            if not data:
                out = bytes(self._buffer)
                self._buffer.clear()
                return out
            self._buffer.extend(data)

    async def _readline_fed(self, conn: _Conn, inbox: _Inbox) -> bytes:
        """readline in the inbox's line mode (see :class:`_Inbox`)."""
        lines = self._lines
        if lines is None:
            lines = self._lines = inbox.start_lines(
                conn.h11, self._buffer, chunked="transfer-encoding" in self.headers)
            self._buffer = bytearray()
        line = lines.line
        while True:
            i = line.find(b"\n", lines.scan)
            if i >= 0:
                out = bytes(memoryview(line)[:i + 1])
                del line[:i + 1]
                lines.scan = 0
                inbox.taken()
                return out
            lines.scan = len(line)
            if len(line) > MAX_LINE_BYTES:
                inbox.stop_lines()
                self._finish(reusable=False)
                raise HttpProtocolError(f"a body line longer than {MAX_LINE_BYTES} bytes")
            if lines.error is not None:
                inbox.stop_lines()
                self._finish(reusable=False)
                raise lines.error
            if lines.end is not None:
                inbox.stop_lines()
                self._finish(reusable=lines.end)
                out = bytes(line)
                line.clear()
                return out
            e = inbox.exception()
            if e is not None:
                inbox.stop_lines()
                if isinstance(e, (ConnectionError, ssl.SSLError)):
                    raise HttpConnectionError(f"{type(e).__name__}: {e}") from e
                raise e
            await inbox.wait_lines(self._read_timeout)

    async def pour(self, sink: Callable[[bytes], None]) -> None:
        """Hand every line of the body (with its newline; the last one perhaps without)
        to ``sink`` until the body ends; raises what :meth:`readline` raises, and what
        ``sink`` raised (the connection is then closed).

        On a connection of this module, ``sink`` is called in the connection's own
        callback as each line is whole (:class:`_Lines`): no task wakes per line, which
        for a thousand watches of the same Nodes was a third of what an event cost. It
        must not block; it runs before this coroutine resumes."""
        conn = self._conn
        if conn is None or self._eof or not isinstance(conn.reader, _Inbox):
            while line := await self.readline():
                sink(line)
            return
        inbox = conn.reader
        lines = self._lines
        if lines is None:
            lines = self._lines = inbox.start_lines(
                conn.h11, self._buffer, chunked="transfer-encoding" in self.headers)
            self._buffer = bytearray()
        lines.sink = sink
        try:
            lines.pour()  # what came with the head
            while True:
                if lines.error is not None:
                    self._finish(reusable=False)
                    raise lines.error
                if len(lines.line) > MAX_LINE_BYTES:
                    self._finish(reusable=False)
                    raise HttpProtocolError(f"a body line longer than {MAX_LINE_BYTES} bytes")
                if lines.end is not None:
                    self._finish(reusable=lines.end)
                    if lines.line:
                        rest = bytes(lines.line)
                        lines.line.clear()
                        sink(rest)
                    return
                e = inbox.exception()
                if e is not None:
                    self._finish(reusable=False)
                    if isinstance(e, (ConnectionError, ssl.SSLError)):
                        raise HttpConnectionError(f"{type(e).__name__}: {e}") from e
                    raise e
                await inbox.wait_lines(self._read_timeout)
        finally:
            lines.sink = None
            inbox.stop_lines()

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
        if self._eof and self._reusable and self._pool is not None \
                and not conn.h11.trailing_data[0]:  # nothing the server sent unasked
            try:
                conn.h11.start_next_cycle()
            except h11.LocalProtocolError:
                conn.close()
                return
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


# -- proxies ------------------------------------------------------------------------------

def _no_proxy_matches(host: str, port: int, no_proxy: str) -> bool:
    """curl's / Go's NO_PROXY: comma-separated host names (a name also covers its
    subdomains; a leading "." or "*." is allowed), IP addresses, CIDR ranges, each
    optionally with ":port"; "*" alone matches everything."""
    host = host.lower().strip("[]")
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port = None
        if entry.startswith("["):
            addr, _, rest = entry[1:].partition("]")
            entry, entry_port = addr, rest.removeprefix(":") or None
        elif entry.count(":") == 1:
            entry, entry_port = entry.split(":")
        if entry_port is not None and entry_port != str(port):
            continue
        if "/" in entry or entry.replace(".", "").isdigit() or ":" in entry:
            import ipaddress  # noqa: PLC0415 (rare: only with an IP entry)

            try:
                net = ipaddress.ip_network(entry, strict=False)
                if ipaddress.ip_address(host) in net:
                    return True
            except ValueError:
                pass
            continue
        entry = entry.removeprefix("*").removeprefix(".")
        if host == entry or host.endswith("." + entry):
            return True
    return False


def _is_loopback(host: str) -> bool:
    """As Go's net/http does: localhost and loopback addresses never go to a proxy."""
    host = host.lower().strip("[]")
    return host == "localhost" or host.endswith(".localhost") or host == "::1" \
        or (host.startswith("127.") and host.replace(".", "").isdigit())


def proxy_from_environment(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """The proxy URL for ``url`` by ``HTTPS_PROXY`` / ``HTTP_PROXY`` (either case) unless
    ``NO_PROXY`` / ``no_proxy`` exempts its host or the host is loopback; None: connect
    directly."""
    env = os.environ if env is None else env
    origin = Origin.of(url)
    name = "https_proxy" if origin.scheme == "https" else "http_proxy"
    proxy = env.get(name) or env.get(name.upper())
    if not proxy:
        return None
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY") or ""
    if _is_loopback(origin.host) or _no_proxy_matches(origin.host, origin.port, no_proxy):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


async def _read_head(reader: _Reader, parser: h11.Connection,
                     timeout: float | None) -> h11.Response:
    """The final answer's head (informational ones skipped), bounded in size and count.
    Raises :class:`_NoAnswerError` when the connection ended before a byte of it."""
    received = 0
    informational = 0
    async with asyncio.timeout(timeout):
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as e:
                if parser.trailing_data[1]:
                    raise HttpConnectionError(
                        f"connection closed inside the response head: {e}") from None
                raise _protocol_error(e) from None
            if event is h11.NEED_DATA:
                try:
                    data = await (reader.read_head(MAX_HEADER_BYTES)
                                  if isinstance(reader, _Inbox)
                                  else reader.read(MAX_HEADER_BYTES))
                except (ConnectionError, ssl.SSLError) as e:
                    if received:
                        raise
                    raise _NoAnswerError(f"{type(e).__name__}: {e}", sent=True) from e
                if not data and not received:
                    raise _NoAnswerError("connection closed before the response", sent=True)
                received += len(data)
                parser.receive_data(data)
            elif isinstance(event, h11.InformationalResponse):
                informational += 1
                if informational > MAX_INFORMATIONAL:
                    raise HttpProtocolError(
                        f"more than {MAX_INFORMATIONAL} informational (1xx) answers")
            elif isinstance(event, h11.Response):
                if len(event.headers) > MAX_HEADERS:
                    raise HttpProtocolError(
                        f"an answer with {len(event.headers)} header fields "
                        f"(at most {MAX_HEADERS})")
                return event
            else:
                raise HttpProtocolError(f"unexpected {type(event).__name__} for an answer")


def _headers_of(event: h11.Response) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name in out:
            if name in SINGLETON_FIELDS:
                if out[name] != value:
                    raise HttpProtocolError(
                        f"conflicting {name} fields: {out[name][:80]!r}, {value[:80]!r}")
                continue
            out[name] = f"{out[name]}, {value}"
        else:
            out[name] = value
    return out


class HttpClient:
    """Requests to one origin over a few kept-alive connections."""

    def __init__(self, base_url: str, *, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None, connect_timeout: float = 10.0,
                 pool_size: int = 32, unix_socket: str | None = None,
                 connect_slots: ConnectSlots | None = None, proxy: str | None = None,
                 trust_env: bool = False) -> None:
        """``pool_size``: idle connections kept for reuse. The pool holds only what
        concurrent requests once opened (a workload cluster's client seldom more than one
        or two), but it must hold as many as a busy client keeps in flight: the
        controller's management client sends 16 writes at once, and with 4 kept the other
        12 each paid a TLS handshake and a close, per request, through a whole start-up.
        ``unix_socket``: connect to this socket instead (``base_url`` names the Host);
        ``connect_slots``: opening a connection waits for one of these (shared by many
        clients) before its ``connect_timeout`` starts.
        ``proxy``: an ``http://[user:password@]host:port`` proxy, through a CONNECT tunnel
        for https (TLS end to end), by absolute-form requests for http; ``trust_env``:
        take it from ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` when not given."""
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
        if proxy is None and trust_env and unix_socket is None:
            proxy = proxy_from_environment(base_url)
        self.proxy: Origin | None = None
        self._proxy_auth: str | None = None
        if proxy is not None:
            self.proxy = Origin.of(proxy)
            if self.proxy.scheme != "http":
                raise ValueError(f"only http:// proxies are supported, not {proxy!r}")
            parts = urlsplit(proxy)
            if parts.username is not None:
                import base64  # noqa: PLC0415

                user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
                self._proxy_auth = f"Basic {base64.b64encode(user.encode()).decode()}"

    async def _connect(self) -> _Conn:
        if self.connect_slots is None:
            return await self._open()
        async with self.connect_slots.semaphore():
            return await self._open()

    async def _open(self) -> _Conn:
        o = self.origin
        try:
            loop = asyncio.get_running_loop()
            if self.unix_socket is not None:
                inbox = _Inbox()
                _, proto = await asyncio.wait_for(loop.create_unix_connection(
                    lambda: _PlainProtocol(inbox), self.unix_socket), self.connect_timeout)
                return _Conn(inbox, proto)
            if self.ssl_context is None:
                host, port = (o.host, o.port) if self.proxy is None else \
                    (self.proxy.host, self.proxy.port)
                inbox = _Inbox()
                _, proto = await asyncio.wait_for(loop.create_connection(
                    lambda: _PlainProtocol(inbox), host, port), self.connect_timeout)
                return _Conn(inbox, proto)
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
        reader = _Inbox()
        server_hostname = self.server_hostname or o.host
        if self.proxy is not None:
            transport = await self._tunnel()
            proto = _TlsProtocol(context, server_hostname, reader)
            transport.set_protocol(proto)
            proto.connection_made(transport)
        else:
            transport, proto = await loop.create_connection(
                lambda: _TlsProtocol(context, server_hostname, reader), o.host, o.port)
        try:
            await proto.handshake
        except BaseException:
            transport.close()
            raise
        return _Conn(reader, proto)

    async def _tunnel(self) -> asyncio.Transport:
        """A TCP connection to the origin through the proxy's CONNECT, not yet used."""
        assert self.proxy is not None
        o, p = self.origin, self.proxy
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES, loop=loop)
        # A bare protocol, no StreamWriter: one dropped would close the transport.
        transport, _ = await loop.create_connection(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), p.host, p.port)
        assert isinstance(transport, asyncio.Transport)
        try:
            parser = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
            host = f"[{o.host}]" if ":" in o.host else o.host
            authority = f"{host}:{o.port}"
            headers = [("Host", authority)]
            if self._proxy_auth is not None:
                headers.append(("Proxy-Authorization", self._proxy_auth))
            transport.write(parser.send(h11.Request(method="CONNECT", target=authority,
                                                    headers=headers)) or b"")
            try:
                head = await _read_head(reader, parser, self.connect_timeout)
            except (HttpError, ConnectionError) as e:
                raise HttpConnectionError(f"proxy {p.host}:{p.port}: {e}") from None
            if not 200 <= head.status_code < 300:
                raise HttpConnectionError(
                    f"proxy {p.host}:{p.port} refused CONNECT {authority}: "
                    f"{head.status_code} {head.reason.decode('latin-1')}")
            if parser.trailing_data[0]:
                raise HttpConnectionError(f"proxy {p.host}:{p.port} sent data before the "
                                          "TLS handshake")
        except BaseException:
            transport.close()
            raise
        return transport

    async def request(self, method: str, target: str, *, headers: Mapping[str, str] | None = None,
                      body: bytes | None = None,
                      read_timeout: float | None = 30.0) -> Response:
        """Send one request; the response's body is left to read (then ``release()``).

        ``target`` is the path (and query) below the base URL. When a kept-alive
        connection fails before a byte of the answer arrived (the server closed it
        meanwhile), the request goes out again on a fresh one if that is safe: it did not
        leave at all, or its method is idempotent. A POST or PATCH the server may have
        acted on is not sent twice: the error is the caller's.
        """
        for attempt in (1, 2):
            conn = self._pool.get()
            fresh = conn is None
            if conn is None:
                conn = await self._connect()
            try:
                return await self._exchange(conn, method, target, headers=headers, body=body,
                                            read_timeout=read_timeout)
            except _NoAnswerError as e:
                conn.close()
                if fresh or attempt == 2 or (e.sent and method.upper() not in IDEMPOTENT):
                    raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Conn, method: str, target: str, *,
                        headers: Mapping[str, str] | None, body: bytes | None,
                        read_timeout: float | None) -> Response:
        path = f"{self.base_path}{target}"
        if self.proxy is not None and self.ssl_context is None:
            path = f"http://{self.origin.host_header}{path}"  # absolute-form, to a proxy
        fields = [("Host", self.origin.host_header)]
        extra = dict(headers or {})
        if not any(k.lower() == "accept-encoding" for k in extra):
            fields.append(("Accept-Encoding", "identity"))
        if self.proxy is not None and self.ssl_context is None and self._proxy_auth:
            fields.append(("Proxy-Authorization", self._proxy_auth))
        fields += [(k, v) for k, v in extra.items() if k.lower() != "content-length"]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            fields.append(("Content-Length", str(len(body or b""))))
        try:
            out = conn.h11.send(h11.Request(method=method, target=path, headers=fields)) or b""
            if body:
                out += b"".join(conn.h11.send_with_data_passthrough(h11.Data(data=body)) or [])
            out += conn.h11.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError as e:
            raise HttpProtocolError(f"cannot send {method} {target[:80]!r}: {e}") from None
        if conn.writer.is_closing():
            raise _NoAnswerError("connection closed before the request", sent=False)
        try:
            try:
                conn.writer.write(out)
            except ConnectionError as e:
                raise _NoAnswerError(f"{type(e).__name__}: {e}", sent=False) from e
            del out
            # Deadlines by asyncio.timeout, not wait_for: wait_for (Python 3.11) runs its
            # awaitable as a new task, one event-loop turn per call even when the data is
            # already buffered; a thousand clusters' start-up is many requests.
            try:
                async with asyncio.timeout(read_timeout):
                    await conn.writer.drain()  # a server not reading
            except (ConnectionError, ssl.SSLError) as e:
                raise _NoAnswerError(f"{type(e).__name__}: {e}", sent=True) from e
            head = await _read_head(conn.reader, conn.h11, read_timeout)
        except _NoAnswerError:
            raise
        except (ConnectionError, ssl.SSLError) as e:
            raise HttpConnectionError(f"{type(e).__name__}: {e}") from e
        resp = Response(status=head.status_code, reason=head.reason.decode("latin-1"),
                        headers=_headers_of(head), _conn=conn, _pool=self._pool,
                        _read_timeout=read_timeout, _reusable=True)
        return resp

    async def close(self) -> None:
        await self._pool.close()
