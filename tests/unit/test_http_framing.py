"""fleet.kube.http against hostile HTTP/1.1 answers (issue 29, finding 4).

A scripted server on 127.0.0.1 writes whatever bytes a test gives it, raw: negative or
hex-prefixed lengths, thousands of headers, conflicting Content-Lengths, a ``100 Continue``
before the answer, a connection dropped after the request was read. The client must end
each with a typed error (:class:`HttpError` or ``TimeoutError``), never read more than the
caller asked for in one call, and never send a request twice unless repeating it is safe.
The property test throws generated answers, each followed by megabytes of junk, and
bounds the memory the client allocates while it reads them (tracemalloc).
"""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.kube.http import (
    HttpClient,
    HttpConnectionError,
    HttpError,
    HttpProtocolError,
    TruncatedBodyError,
)

DEADLINE = 30.0
PIECE = b"x" * (64 * 1024)


@dataclass
class Answer:
    """What the server writes for one request: ``head`` (raw bytes), then ``tail`` bytes
    of junk in 64 KiB writes; ``then``: "close" the connection or "keep" it open."""

    head: bytes
    tail: int = 0
    then: str = "close"


@dataclass
class ScriptedServer:
    answers: list[Answer | None]  # None: read the request, then close without a byte
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        if self._handlers:
            await asyncio.wait(list(self._handlers))
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests.append(head.split(b"\r\n", 1)[0])
                answer = self.answers.pop(0) if self.answers else None
                if answer is None:
                    return
                writer.write(answer.head)
                await writer.drain()
                sent = 0
                while sent < answer.tail:
                    piece = PIECE[:answer.tail - sent]
                    writer.write(piece)
                    sent += len(piece)
                    await writer.drain()
                if answer.then == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def serving(*answers: Answer | None) -> AsyncIterator[tuple[ScriptedServer, HttpClient]]:
    server = ScriptedServer(list(answers))
    await server.start()
    client = HttpClient(f"http://127.0.0.1:{server.port}", connect_timeout=5.0)
    try:
        yield server, client
    finally:
        await client.close()
        await server.close()


async def read_all(client: HttpClient, method: str = "GET", limit: int = 1024) -> bytes:
    """The whole body, in reads of at most ``limit`` bytes (each checked)."""
    resp = await client.request(method, "/", read_timeout=5.0,
                                body=b"{}" if method in ("POST", "PATCH") else None)
    try:
        out = bytearray()
        while chunk := await resp.read_chunk(limit):
            assert len(chunk) <= limit
            out += chunk
        return bytes(out)
    finally:
        resp.release()


# -- regressions, one per sub-finding ------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("length", [b"-1", b"+10", b"0x10", b"1_0", b"10, 20", b"1e3"])
async def test_a_content_length_that_is_not_digits_is_a_protocol_error(length: bytes) -> None:
    """``int()`` took ``-1`` (then a read of the whole stream in one call) and ``1_0``."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: " + length + b"\r\n\r\n"
    async with serving(Answer(head, tail=4 * 1024 * 1024)) as (_, client):
        with anyio.fail_after(DEADLINE), pytest.raises(HttpProtocolError):
            await read_all(client)


@pytest.mark.anyio
@pytest.mark.parametrize("size", [b"+0x1_0", b"-1", b"0x10", b" 10", b"1_0", b"-0"])
async def test_a_chunk_size_that_is_not_hex_digits_is_a_protocol_error(size: bytes) -> None:
    head = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + size + b"\r\n" + b"y" * 16 + b"\r\n0\r\n\r\n")
    async with serving(Answer(head, tail=4 * 1024 * 1024)) as (_, client):
        with anyio.fail_after(DEADLINE), pytest.raises(HttpProtocolError):
            await read_all(client)


@pytest.mark.anyio
async def test_thousands_of_headers_are_a_protocol_error() -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
            + b"".join(b"X-%d: v\r\n" % i for i in range(5000)) + b"\r\nok")
    async with serving(Answer(head)) as (_, client):
        with anyio.fail_after(DEADLINE), pytest.raises(HttpProtocolError):
            await read_all(client)


@pytest.mark.anyio
async def test_a_head_larger_than_the_bound_is_a_protocol_error() -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
            + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 4000) for i in range(40)) + b"\r\nok")
    async with serving(Answer(head)) as (_, client):
        with anyio.fail_after(DEADLINE), pytest.raises(HttpProtocolError):
            await read_all(client)


@pytest.mark.anyio
async def test_conflicting_content_lengths_are_a_protocol_error() -> None:
    """They were joined into "5, 100", then ignored: the body ran to the close."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 100\r\n\r\nhello"
    async with serving(Answer(head, tail=1000)) as (_, client):
        with anyio.fail_after(DEADLINE), pytest.raises(HttpProtocolError):
            await read_all(client)


@pytest.mark.anyio
async def test_conflicting_locations_are_a_protocol_error_not_joined() -> None:
    head = (b"HTTP/1.1 302 Found\r\nLocation: https://a.example/x\r\n"
            b"Location: https://b.example/y\r\nContent-Length: 0\r\n\r\n")
    async with serving(Answer(head)) as (_, client):
        with anyio.fail_after(DEADLINE), pytest.raises(HttpProtocolError):
            await read_all(client)


@pytest.mark.anyio
async def test_repeated_list_headers_are_still_joined() -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n"
            b"Warning: 1\r\nWarning: 2\r\n\r\nok")
    async with serving(Answer(head)) as (_, client):
        with anyio.fail_after(DEADLINE):
            resp = await client.request("GET", "/")
            assert resp.headers["warning"] == "1, 2"
            assert resp.content_length == 2
            assert await resp.read() == b"ok"
            resp.release()


@pytest.mark.anyio
async def test_informational_answers_are_skipped() -> None:
    """A ``100 Continue`` was taken as the final answer (with an empty body), and the real
    one was then read as the answer to the next request on that connection."""
    head = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
    second = b"HTTP/1.1 201 Created\r\nContent-Length: 6\r\n\r\nsecond"
    async with serving(Answer(head, then="keep"), Answer(second)) as (server, client):
        with anyio.fail_after(DEADLINE):
            resp = await client.request("GET", "/")
            assert (resp.status, await resp.read()) == (200, b"first")
            resp.release()
            resp = await client.request("GET", "/")
            assert (resp.status, await resp.read()) == (201, b"second")
            resp.release()
    assert server.connections == 1


@pytest.mark.anyio
async def test_endless_informational_answers_are_a_protocol_error() -> None:
    head = b"HTTP/1.1 100 Continue\r\n\r\n" * 1000
    async with serving(Answer(head)) as (_, client):
        with anyio.fail_after(DEADLINE), pytest.raises(HttpProtocolError):
            await read_all(client)


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_a_non_idempotent_request_is_not_resent(method: str) -> None:
    """The pooled connection's server reads the request and closes without a word: it may
    have acted on it, so sending it again on a fresh connection could do it twice."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with serving(Answer(ok, then="keep"), None, Answer(ok)) as (server, client):
        with anyio.fail_after(DEADLINE):
            assert await read_all(client) == b"ok"  # leaves the connection in the pool
            with pytest.raises(HttpConnectionError):
                await read_all(client, method)
    assert [r.split(b" ")[0] for r in server.requests] == [b"GET", method.encode()]


@pytest.mark.anyio
async def test_an_idempotent_request_is_resent_when_no_answer_began() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with serving(Answer(ok, then="keep"), None, Answer(ok)) as (server, client):
        with anyio.fail_after(DEADLINE):
            assert await read_all(client) == b"ok"
            assert await read_all(client) == b"ok"
    assert server.requests == [b"GET / HTTP/1.1"] * 3
    assert server.connections == 2


@pytest.mark.anyio
async def test_an_idempotent_request_is_not_resent_once_its_answer_began() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with serving(Answer(ok, then="keep"), Answer(b"HTTP/1.1 200 OK\r\nConte"),
                       Answer(ok)) as (server, client):
        with anyio.fail_after(DEADLINE):
            assert await read_all(client) == b"ok"
            with pytest.raises(HttpError):
                await read_all(client)
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_body_cut_short_is_truncated_and_a_close_framed_body_is_whole() -> None:
    async with serving(Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"),
                       Answer(b"HTTP/1.1 200 OK\r\n\r\nuntil close", tail=100_000)) \
            as (_, client):
        with anyio.fail_after(DEADLINE):
            with pytest.raises(TruncatedBodyError):
                await read_all(client)
            body = await read_all(client, limit=4096)
    assert body == b"until close" + b"x" * 100_000


# -- the property ---------------------------------------------------------------------------

TAIL = 4 * 1024 * 1024  # junk after each answer's head, more than the bound below
READ_LIMIT = 16 * 1024
MEMORY_BOUND = 1536 * 1024  # a 4 MiB read in one call (the old -1 length) is far above

lengths = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: str(n).encode()),
    st.sampled_from([b"-1", b"+0x10", b"0x10", b"1_0", b" 7 ", b"7, 8", b"7,7", b"", b"1e3",
                     b"\xff", b"99999999999999999999999999"]),
)
chunk_sizes = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: b"%x" % n if n >= 0
                                                          else b"-%x" % -n),
    st.sampled_from([b"+0x1_0", b"-1", b"0x10", b"1_0", b"10;ext=1", b"", b"fffffffffffffffff",
                     b" 10", b"g"]),
)
header_names = st.sampled_from([b"Content-Length", b"Transfer-Encoding", b"Connection",
                                b"Location", b"Content-Type", b"X-Junk", b"", b"Bad Name",
                                b"\x00", b"content-length"])
header_values = st.one_of(lengths, st.sampled_from([b"chunked", b"gzip, chunked", b"close",
                                                    b"keep-alive", b"identity"]),
                          st.binary(max_size=20))
status_lines = st.one_of(
    st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 100 Continue",
                     b"HTTP/1.1 101 Switching Protocols", b"HTTP/1.1 204 No Content",
                     b"HTTP/1.1 304 Not Modified", b"HTTP/2 200", b"HTTP/1.1 -1 X",
                     b"HTTP/1.1 99999 X", b"HTTP/1.1 200", b"ICY 200 OK", b"HTTP/1.1 2OO OK"]),
    st.binary(max_size=30),
)


@st.composite
def hostile_heads(draw: st.DrawFn) -> bytes:
    lines = [draw(status_lines)]
    lines += [draw(header_names) + b": " + draw(header_values)
              for _ in range(draw(st.integers(0, 6)))]
    framing = draw(st.sampled_from(["length", "chunked", "both", "none"]))
    if framing in ("length", "both"):
        lines.append(b"Content-Length: " + draw(lengths))
    if framing in ("chunked", "both"):
        lines.append(b"Transfer-Encoding: chunked")
    many = draw(st.sampled_from([0, 0, 0, 200, 3000]))
    lines += [b"X-%d: v" % i for i in range(many)]
    head = b"\r\n".join(lines) + draw(st.sampled_from([b"\r\n\r\n", b"\n\n", b"\r\n"]))
    if framing == "chunked":
        head += draw(chunk_sizes) + b"\r\n"
    return head + draw(st.binary(max_size=40))


async def _throw(head: bytes) -> int:
    """Send ``head`` plus TAIL bytes of junk; read the answer as callers do. The peak
    of memory allocated meanwhile (the server's writes are 64 KiB each, made once)."""
    async with serving(Answer(head, tail=TAIL)) as (_, client):
        tracemalloc.start()
        try:
            with anyio.fail_after(DEADLINE):
                try:
                    resp = await client.request("GET", "/", read_timeout=10.0)
                    try:
                        assert 100 <= resp.status <= 999
                        while chunk := await resp.read_chunk(READ_LIMIT):
                            assert len(chunk) <= READ_LIMIT
                    finally:
                        resp.release()
                except (HttpError, TimeoutError):
                    pass  # a typed error: fine. Anything else fails the test.
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(head=hostile_heads())
def test_hostile_answers_end_in_a_typed_error_within_bounded_memory(head: bytes) -> None:
    peak = anyio.run(_throw, head)
    assert peak < MEMORY_BOUND, f"{peak} bytes allocated reading {head[:200]!r}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.binary(max_size=300))
def test_random_bytes_end_in_a_typed_error_within_bounded_memory(head: bytes) -> None:
    peak = anyio.run(_throw, head)
    assert peak < MEMORY_BOUND, f"{peak} bytes allocated reading {head[:200]!r}"


@pytest.mark.anyio
async def test_the_agent_download_of_a_negative_length_fails_without_reading_it_all(
        tmp_path: Path) -> None:
    """The issue's experiment through the agent's own download code: a release server
    that announces ``Content-Length: -1`` and sends 32 MiB. The download fails naming the
    framing, and no read takes the whole stream into memory (the old client read all 32
    MiB in one call against the agent's 1 MiB reads)."""
    from fleet.agents.download import DownloadError, DownloadPolicy, ensure_staged  # noqa: PLC0415

    binary = tmp_path / "k0s"
    binary.write_bytes(b"installed")
    head = b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"
    async with serving(Answer(head, tail=32 * 1024 * 1024)) as (server, _):
        tracemalloc.start()
        try:
            with anyio.fail_after(DEADLINE), pytest.raises(DownloadError) as failed:
                await ensure_staged(f"http://127.0.0.1:{server.port}/k0s", "0" * 64, binary,
                                    DownloadPolicy(attempts=1, free_space_margin=0))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert "Content-Length" in str(failed.value), failed.value
    assert peak < 4 * 1024 * 1024, peak
    assert binary.read_bytes() == b"installed"
