"""fleet.kube.http reading a body by lines (a watch): the connection's inbox parses what
arrives as it arrives and wakes the reader once per whole line, and reads the plainest
chunks itself, handing the stream to h11 at the first chunk header that is not plain.

Driven in memory: the client's protocol is fed bytes as a socket would deliver them, in
any pieces; no server, no sleep. Whatever the pieces and however the chunks are framed,
the lines are those of the body, exactly, and a malformed or cut body is the same named
error h11 gives it."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.kube.http import (
    HttpProtocolError,
    Response,
    TruncatedBodyError,
    _Conn,
    _headers_of,
    _Inbox,
    _PlainProtocol,
    _read_head,
)

pytestmark = pytest.mark.anyio
T = TypeVar("T")

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the inbox is asyncio's


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.paused = False
        self.closed = False

    def write(self, data: Any) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def _response(first: bytes = b"", timeout: float = 30.0
                    ) -> tuple[Response, _PlainProtocol, _Transport]:
    """A GET's answer over an in-memory connection whose first socket read is the head
    and ``first``."""
    inbox = _Inbox()
    proto = _PlainProtocol(inbox)
    transport = _Transport()
    proto.connection_made(transport)
    conn = _Conn(inbox, proto)
    conn.h11.send(h11.Request(method="GET", target="/watch", headers=[("Host", "x")]))
    conn.h11.send(h11.EndOfMessage())
    proto.data_received(HEAD + first)
    head = await _read_head(inbox, conn.h11, timeout)
    return Response(status=head.status_code, reason="OK", headers=_headers_of(head),
                    _conn=conn, _pool=None, _read_timeout=timeout,
                    _reusable=True), proto, transport


def _chunk(data: bytes, size_text: str | None = None) -> bytes:
    return (size_text or f"{len(data):x}").encode() + b"\r\n" + data + b"\r\n"


def _pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(stream) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(stream)]:
        if p > prev:
            out.append(stream[prev:p])
            prev = p
    return out


async def _all_lines(resp: Response, mode: str = "readline") -> list[bytes]:
    """The body's lines, read by ``readline`` or poured (:meth:`Response.pour`)."""
    lines: list[bytes] = []
    if mode == "pour":
        await resp.pour(lines.append)
        return lines
    while line := await resp.readline():
        lines.append(line)
    return lines


@types.coroutine
def _counted(aw: Awaitable[T], steps: list[int]) -> Generator[Any, Any, T]:
    """``aw``, counting how often the event loop resumed it."""
    it = aw.__await__()
    value: Any = None
    while True:
        steps[0] += 1
        try:
            yielded = it.send(value)
        except StopIteration as e:
            return e.value  # type: ignore[no-any-return]
        value = yield yielded


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# what a chunk's size may look like: plain (read by the inbox) or not (read by h11)
_SIZE_TEXT = st.sampled_from(["plain", "upper", "zeros", "ext", "space"])


def _size(n: int, how: str) -> str:
    return {"plain": f"{n:x}", "upper": f"{n:X}", "zeros": f"000{n:x}",
            "ext": f"{n:x};name=value", "space": f"{n:x} "}[how]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")),
                      max_size=8),
       bodies=st.lists(st.integers(0, 2000), max_size=6),
       sizes=st.lists(_SIZE_TEXT, min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, 10_000), max_size=12),
       last_newline=st.booleans(), trailers=st.booleans(), early=st.booleans(),
       mode=st.sampled_from(["readline", "pour"]))
async def test_lines_are_the_body_s_lines_however_framed_and_cut(
        *, lines: list[bytes], bodies: list[int], sizes: list[str], cuts: list[int],
        last_newline: bool, trailers: bool, early: bool, mode: str) -> None:
    body = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    # the body in chunks of the sizes drawn (never empty: a 0 chunk ends the body)
    chunks, at = [], 0
    for i, n in enumerate([*bodies, len(body)]):
        piece = body[at:at + max(1, n)]
        if not piece:
            break
        chunks.append(_chunk(piece, _size(len(piece), sizes[i % len(sizes)])))
        at += len(piece)
    stream = b"".join(chunks) + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailers else b"") + b"\r\n"
    pieces = _pieces(stream, cuts)
    if early and pieces:  # some of the body came with the head's read
        first, pieces = pieces[0], pieces[1:]
    else:
        first = b""
    resp, proto, _ = await _response(first)
    got: list[bytes] = []

    async def read() -> None:
        got.extend(await _all_lines(resp, mode))

    task = asyncio.ensure_future(read())
    for piece in pieces:
        await _turns(1)
        proto.data_received(piece)
    await asyncio.wait_for(task, 30)
    expected = [line + b"\n" for line in body.split(b"\n")[:-1]]
    if body and not body.endswith(b"\n"):
        expected.append(body.rsplit(b"\n", 1)[-1])
    assert got == expected
    assert resp._eof and resp._reusable  # h11 read the end: the connection may be reused
    assert await resp.readline() == b""


async def test_the_reader_is_woken_once_per_line_however_many_pieces_it_comes_in() -> None:
    resp, proto, _ = await _response()
    line = b'{"type":"MODIFIED","object":{' + b'"x":1,' * 2000 + b'"y":2}}\n'
    first = _chunk(line[:4000]) + _chunk(line[4000:])  # as a kube-apiserver's 4 KiB buffer
    steps = [0]
    task = asyncio.ensure_future(_counted(resp.readline(), steps))
    await _turns()
    assert steps[0] == 1 and not task.done()  # waiting
    for i in range(0, len(first), 700):  # in 18 pieces, each let in before the next
        proto.data_received(first[i:i + 700])
        await _turns()
    assert task.done() and task.result() == line
    assert steps[0] == 2  # woken once: when the line was whole
    steps = [0]
    task = asyncio.ensure_future(_counted(resp.readline(), steps))
    await _turns()
    proto.data_received(_chunk(line))
    await asyncio.wait_for(task, 30)
    assert task.result() == line and steps[0] == 2


@pytest.mark.parametrize(("stream", "error", "message"), [
    (_chunk(b"abc\n")[:-2] + b"XY", HttpProtocolError, "malformed chunk footer"),
    (b"zz\r\nabc\r\n", HttpProtocolError, "illegal chunk header"),
    (_chunk(b"abc\n") + b"5\r\nab", TruncatedBodyError, "incomplete chunked read"),
    (_chunk(b"abc\n") + b"5", TruncatedBodyError, "connection closed inside the body"),
    (_chunk(b"abc\n"), TruncatedBodyError, "connection closed inside the body"),
])
@pytest.mark.parametrize("mode", ["readline", "pour"])
async def test_a_malformed_or_cut_body_is_a_named_error(
        stream: bytes, error: type[Exception], message: str, mode: str) -> None:
    resp, proto, _ = await _response()
    proto.data_received(stream)
    proto.eof_received()
    with pytest.raises(error, match=message):
        await _all_lines(resp, mode)
    assert not resp._reusable


@pytest.mark.parametrize("mode", ["readline", "pour"])
async def test_a_line_longer_than_the_bound_is_refused(
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    from fleet.kube import http  # noqa: PLC0415

    monkeypatch.setattr(http, "MAX_LINE_BYTES", 10_000)
    resp, proto, _ = await _response()
    task = asyncio.ensure_future(_all_lines(resp, mode))
    for _ in range(20):
        proto.data_received(_chunk(b"x" * 1000))
        await _turns(1)
    with pytest.raises(HttpProtocolError, match="longer than 10000"):
        await asyncio.wait_for(task, 30)


async def test_poured_lines_are_taken_in_the_connection_s_callback_without_a_task_turn(
        ) -> None:
    resp, proto, _ = await _response(_chunk(b"early\n"))
    got: list[bytes] = []
    steps = [0]
    task = asyncio.ensure_future(_counted(resp.pour(got.append), steps))
    await _turns()
    assert got == [b"early\n"] and steps[0] == 1  # what came with the head, then waiting
    line = b'{"type":"MODIFIED","object":{' + b'"x":1,' * 2000 + b'"y":2}}\n'
    stream = _chunk(line[:4000]) + _chunk(line[4000:] + b"second\nthi")
    for i in range(0, len(stream), 700):
        proto.data_received(stream[i:i + 700])
    # every whole line was handed over inside data_received: no turn of the loop since
    assert got == [b"early\n", line, b"second\n"]
    assert steps[0] == 1 and not task.done()
    proto.data_received(_chunk(b"rd\n") + b"0\r\n\r\n")
    assert got[-1] == b"third\n"
    await asyncio.wait_for(task, 30)
    assert steps[0] == 2  # woken once: at the body's end
    assert resp._eof and resp._reusable


async def test_what_the_sink_raises_ends_the_pour_and_the_connection() -> None:
    resp, proto, transport = await _response()
    got: list[bytes] = []

    def sink(line: bytes) -> None:
        if line.startswith(b"bad"):
            raise LookupError("the listener refused it")
        got.append(line)

    task = asyncio.ensure_future(resp.pour(sink))
    await _turns()
    proto.data_received(_chunk(b"one\nbad\nnever\n"))
    proto.data_received(_chunk(b"nor this\n"))  # after the failure: not handed over
    with pytest.raises(LookupError, match="refused"):
        await asyncio.wait_for(task, 30)
    assert got == [b"one\n"]
    assert not resp._reusable
    resp.release()
    assert transport.closed


async def test_a_silent_poured_stream_times_out_and_a_lost_one_is_a_connection_error(
        ) -> None:
    got: list[bytes] = []
    resp, proto, _ = await _response(_chunk(b"first\n"), timeout=0.2)
    with pytest.raises(TimeoutError):
        await resp.pour(got.append)
    assert got == [b"first\n"]
    resp, proto, _ = await _response(_chunk(b"first\n"))
    task = asyncio.ensure_future(resp.pour(got.append))
    await _turns()
    proto.connection_lost(ConnectionResetError("reset by peer"))
    with pytest.raises(OSError, match="ConnectionResetError: reset by peer"):
        await asyncio.wait_for(task, 30)


async def test_a_reader_that_falls_behind_pauses_the_socket_until_it_reads() -> None:
    resp, proto, transport = await _response()
    line = b"y" * 4000 + b"\n"
    for _ in range(200):  # 800 KB of lines nobody reads yet
        proto.data_received(_chunk(line))
    assert transport.paused
    for _ in range(200):
        assert await resp.readline() == line
    assert not transport.paused


async def test_a_silent_stream_times_out_and_a_lost_one_is_a_connection_error() -> None:
    resp, proto, _ = await _response(_chunk(b"first\n"), timeout=0.2)
    assert await resp.readline() == b"first\n"
    with pytest.raises(TimeoutError):
        await resp.readline()
    resp, proto, _ = await _response(_chunk(b"first\n"))
    assert await resp.readline() == b"first\n"
    proto.connection_lost(ConnectionResetError("reset by peer"))
    with pytest.raises(OSError, match="ConnectionResetError: reset by peer"):
        await resp.readline()


async def test_a_unix_socket_connection_reads_answers_and_lines(tmp_path: Any) -> None:
    """The node agent asks k0s's status API over a unix socket: the same inbox."""
    from fleet.kube.http import HttpClient  # noqa: PLC0415

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readuntil(b"\r\n\r\n")).startswith(b"GET /status"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"Pid\": 42}")
            await writer.drain()
        writer.write(HEAD + _chunk(b"one\ntw") + _chunk(b"o\n") + b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    path = str(tmp_path / "status.sock")
    server = await asyncio.start_unix_server(serve, path)
    client = HttpClient("http://localhost", unix_socket=path, connect_timeout=5.0)
    try:
        resp = await client.request("GET", "/status", read_timeout=5.0)
        assert (resp.status, await resp.read()) == (200, b'{"Pid": 42}')
        resp.release()  # kept alive: the next request goes on the same connection
        resp = await client.request("GET", "/lines", read_timeout=5.0)
        assert await asyncio.wait_for(_all_lines(resp), 10) == [b"one\n", b"two\n"]
        resp.release()
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_kept_alive_connection_does_not_carry_a_watch_s_idle_deadline() -> None:
    """A watch that ended (its connection kept alive) leaves no idle deadline behind: the
    next answer on that connection may take longer than the watch's timeout."""
    resp, proto, _ = await _response(timeout=0.05)
    task = asyncio.ensure_future(_all_lines(resp))
    await _turns()  # waiting for a line: its idle deadline is armed
    proto.data_received(_chunk(b"one\n") + b"0\r\n\r\n")
    assert await asyncio.wait_for(task, 10) == [b"one\n"]
    conn = resp._conn
    assert conn is not None and resp._eof and resp._reusable
    conn.h11.start_next_cycle()  # as the pool does
    conn.h11.send(h11.Request(method="GET", target="/list", headers=[("Host", "x")]))
    conn.h11.send(h11.EndOfMessage())
    proto.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
    head = await _read_head(conn.reader, conn.h11, 10)
    second = Response(status=head.status_code, reason="OK", headers=_headers_of(head),
                      _conn=conn, _pool=None, _read_timeout=10.0, _reusable=True)
    body = asyncio.ensure_future(second.read())
    await asyncio.sleep(0.2)  # the watch's deadline (0.05 s) would have passed by now
    assert not body.done()
    proto.data_received(b"0123456789")
    assert await asyncio.wait_for(body, 10) == b"0123456789"
