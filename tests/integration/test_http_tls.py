"""The light transport's HTTP over TLS (fleet.kube.http, the node agent's wire) against
a real TLS server that misbehaves on purpose: bodies in one record or one byte per
record, a slow reader (the socket paused and resumed many times), hundreds of concurrent
requests, a server that closes kept-alive connections, truncates bodies with and without
close_notify, never answers, or never finishes the handshake.

Every read here either completes with the exact bytes sent or fails with a named error
within its deadline: a stall (a read that does not wake for data already received) shows
up as a TimeoutError of the generous outer deadline, which fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.lowlevel
import pytest

from fleet.kube.http import ConnectSlots, HttpClient, HttpConnectionError, TruncatedBodyError
from fleet.testing.kubesim.certs import ServingCert, make_serving_cert

pytestmark = pytest.mark.anyio

DEADLINE = 120.0  # far above any of these exchanges, even on a loaded 2-core machine


def body_of(n: int) -> bytes:
    return random.Random(n).randbytes(n)


@dataclass
class TlsServer:
    """An HTTP/1.1 server over TLS (asyncio's own server-side TLS), by path:

    ``/body/N?framing=length|chunked|close&piece=P`` N bytes in writes of P bytes;
    ``/lines/K`` K JSON lines, chunked, one write each; ``/hang`` no answer;
    ``/stall/N`` headers for N bytes, half of them, then nothing; ``/truncate/N`` half
    of N bytes, then a reset without close_notify; ``/truncate-clean/N`` half, then
    close_notify; ``/drop-after/N`` N bytes kept alive by its headers, then the server
    closes the connection anyway (a keep-alive timeout racing the next request).
    """

    ssl_context: ssl.SSLContext
    port: int = 0
    connections: int = 0
    _server: asyncio.Server | None = None
    _open: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0,
                                                  ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._open):
            w.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                target = line.split(b" ")[1].decode()
                if not await self._answer(target, writer):
                    return
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            return
        finally:
            self._open.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _answer(self, target: str, w: asyncio.StreamWriter) -> bool:
        """Answer one request; False: the connection is done."""
        url = urlsplit(target)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        kind, n = parts[0], int(parts[1]) if len(parts) > 1 else 0
        if kind == "hang":
            await asyncio.Event().wait()
        if kind == "lines":
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(n):
                line = b'{"i":%d,"pad":"%s"}\n' % (i, b"x" * (i * 37 % 3000))
                w.write(b"%x\r\n%s\r\n" % (len(line), line))
                await w.drain()
            w.write(b"0\r\n\r\n")
            await w.drain()
            return True
        body = body_of(n)
        if kind in ("stall", "truncate", "truncate-clean"):
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n + body[:n // 2])
            await w.drain()
            if kind == "stall":
                await asyncio.Event().wait()
            if kind == "truncate":
                w.transport.abort()
            return False
        framing, piece = q.get("framing", "length"), int(q.get("piece", n or 1))
        head = [b"HTTP/1.1 200 OK"]
        if framing == "length":
            head.append(b"Content-Length: %d" % n)
        elif framing == "chunked":
            head.append(b"Transfer-Encoding: chunked")
        else:
            head.append(b"Connection: close")
        w.write(b"\r\n".join(head) + b"\r\n\r\n")
        for i in range(0, n, piece):
            data = body[i:i + piece]
            w.write(b"%x\r\n%s\r\n" % (len(data), data) if framing == "chunked" else data)
            await w.drain()
        if framing == "chunked":
            w.write(b"0\r\n\r\n")
        await w.drain()
        return framing != "close" and kind != "drop-after"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> ServingCert:
    return make_serving_cert(Path(tmp_path_factory.mktemp("tls")), cn="tls-test")


def server_context(cert: ServingCert, version: ssl.TLSVersion) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert.cert, cert.key)
    ctx.minimum_version = ctx.maximum_version = version
    return ctx


@pytest.fixture(params=[ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2], ids=["tls1.3", "tls1.2"])
async def server(request: pytest.FixtureRequest, cert: ServingCert) -> AsyncIterator[TlsServer]:
    s = TlsServer(server_context(cert, request.param))
    await s.start()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def client(server: TlsServer, cert: ServingCert) -> AsyncIterator[HttpClient]:
    c = HttpClient(f"https://127.0.0.1:{server.port}",
                   ssl_context=ssl.create_default_context(cafile=str(cert.ca)), pool_size=4)
    try:
        yield c
    finally:
        await c.close()


async def get(client: HttpClient, target: str, *, chunk: int = 256 * 1024,
              read_timeout: float = DEADLINE) -> bytes:
    resp = await client.request("GET", target, read_timeout=read_timeout)
    try:
        assert resp.status == 200
        out = bytearray()
        while data := await resp.read_chunk(chunk):
            out.extend(data)
        return bytes(out)
    finally:
        resp.release()


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
@pytest.mark.parametrize("n,piece", [(0, 1), (1, 1), (5000, 1), (300_000, 300_000),
                                     (2_000_000, 16_384), (2_000_000, 70_001)])
async def test_bodies_arrive_whole_in_any_record_size(client: HttpClient, framing: str,
                                                      n: int, piece: int) -> None:
    """Whatever the records look like (one byte each, one 300 KB write, records split
    across reads), the body is exactly what was sent, and the next request on the
    kept-alive connection works too."""
    with anyio.fail_after(DEADLINE):
        for _ in range(2):
            assert await get(client, f"/body/{n}?framing={framing}&piece={piece}") == body_of(n)


async def test_a_slow_reader_pauses_the_socket_and_still_gets_every_byte(
        client: HttpClient) -> None:
    """8 MB read 1 KiB at a time, yielding between reads: the stream reader pauses and
    resumes the socket hundreds of times; nothing is lost or stuck."""
    n = 8 * 1024 * 1024
    with anyio.fail_after(DEADLINE):
        resp = await client.request("GET", f"/body/{n}?piece=65536", read_timeout=DEADLINE)
        out = bytearray()
        while data := await resp.read_chunk(1024):
            out.extend(data)
            await anyio.lowlevel.checkpoint()
        resp.release()
    assert hashlib.sha256(out).digest() == hashlib.sha256(body_of(n)).digest()


async def test_hundreds_of_concurrent_requests_and_streams_on_one_client(
        server: TlsServer, client: HttpClient) -> None:
    """300 exchanges from 100 tasks (4 pooled connections, the rest fresh and closed):
    bodies of random size, framing and record size, and line streams read line by line."""
    rng = random.Random(7)
    jobs: list[str] = []
    for _ in range(300):
        if rng.random() < 0.25:
            jobs.append(f"/lines/{rng.randrange(1, 200)}")
        else:
            n = rng.choice([0, 10, 4096, 16_384, 16_385, 100_000, 1_000_000])
            framing = rng.choice(["length", "chunked", "close"])
            jobs.append(f"/body/{n}?framing={framing}&piece={rng.choice([1000, 16384, n or 1])}")
    done: list[str] = []
    limit = anyio.Semaphore(100)

    async def one(target: str) -> None:
        async with limit:
            if target.startswith("/lines/"):
                k = int(target.rsplit("/", 1)[1])
                resp = await client.request("GET", target, read_timeout=DEADLINE)
                lines = []
                while line := await resp.readline():
                    lines.append(line)
                resp.release()
                assert [int(x.split(b",")[0][5:]) for x in lines] == list(range(k))
            else:
                n = int(urlsplit(target).path.rsplit("/", 1)[1])
                assert await get(client, target) == body_of(n), target
            done.append(target)

    with anyio.fail_after(DEADLINE * 2):
        async with anyio.create_task_group() as tg:
            for target in jobs:
                tg.start_soon(one, target)
    assert len(done) == len(jobs)
    assert server.connections > 4  # not all on the pooled connections


async def test_a_kept_alive_connection_the_server_closed_is_replaced(
        server: TlsServer, client: HttpClient) -> None:
    """The server closes (close_notify) a connection its headers said to keep: the client
    pools it, and the next request finds it closed and goes out on a fresh one."""
    with anyio.fail_after(DEADLINE):
        for i in range(20):
            assert await get(client, f"/drop-after/{100 + i}") == body_of(100 + i)
            assert await get(client, "/body/50") == body_of(50)
    assert server.connections >= 20


@pytest.mark.parametrize("kind", ["truncate", "truncate-clean"])
async def test_a_truncated_body_is_a_named_error_not_a_hang(client: HttpClient,
                                                            kind: str) -> None:
    with anyio.fail_after(DEADLINE), pytest.raises((TruncatedBodyError, HttpConnectionError)):
        await get(client, f"/{kind}/1000000")
    with anyio.fail_after(DEADLINE):  # and the client goes on working
        assert await get(client, "/body/10") == body_of(10)


async def test_silence_after_the_request_or_mid_body_is_the_read_timeout(
        client: HttpClient) -> None:
    with anyio.fail_after(DEADLINE):
        with pytest.raises(TimeoutError):
            await client.request("GET", "/hang", read_timeout=1.0)
        with pytest.raises(TimeoutError):
            await get(client, "/stall/100000", read_timeout=1.0)
        assert await get(client, "/body/10") == body_of(10)


async def test_a_server_that_stops_reading_the_request_is_the_read_timeout(
        client: HttpClient) -> None:
    """64 MB sent to a server that reads only the headers: the socket's buffers fill,
    writing pauses, and the wait for room ends at the read timeout."""
    with anyio.fail_after(DEADLINE):
        with pytest.raises(TimeoutError):
            await client.request("PUT", "/hang", body=bytes(64 * 1024 * 1024),
                                 read_timeout=2.0)
        assert await get(client, "/body/10") == body_of(10)


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel's backlog) and never speaks."""
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


async def test_a_handshake_that_never_finishes_is_the_connect_timeout(
        cert: ServingCert) -> None:
    with silent_listener() as port:
        c = HttpClient(f"https://127.0.0.1:{port}", connect_timeout=1.0,
                       ssl_context=ssl.create_default_context(cafile=str(cert.ca)))
        with anyio.fail_after(DEADLINE), pytest.raises(HttpConnectionError, match="no answer"):
            await c.request("GET", "/")
        await c.close()


async def test_clients_sharing_connect_slots_open_that_many_connections_at_once(
        cert: ServingCert) -> None:
    """Six clients (a controller's workload clusters) sharing two connect slots, against a
    server that accepts connections and never answers the handshake: at most two are
    being opened at any time, each still fails on its own connect deadline, and the
    time spent waiting for a slot is not part of that deadline (every client reaches the
    server; counted, the later ones would time out before connecting)."""
    seen = 0
    opening = most = 0  # connects in progress, counted by the clients

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        seen += 1
        try:
            await reader.read()  # until the client gives up and closes
        finally:
            writer.close()

    class Counting(HttpClient):
        async def _open(self) -> Any:
            nonlocal opening, most
            opening += 1
            most = max(most, opening)
            try:
                return await super()._open()
            finally:
                opening -= 1

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    slots = ConnectSlots(2)
    clients = [Counting(f"https://127.0.0.1:{port}", connect_timeout=1.0,
                        ssl_context=ssl.create_default_context(cafile=str(cert.ca)),
                        connect_slots=slots) for _ in range(6)]
    errors: list[str] = []

    async def one(c: HttpClient) -> None:
        try:
            await c.request("GET", "/")
        except HttpConnectionError as e:
            errors.append(str(e))

    try:
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tg:
                for c in clients:
                    tg.start_soon(one, c)
    finally:
        for c in clients:
            await c.close()
        server.close()
        await server.wait_closed()
    assert len(errors) == 6 and all("no answer within 1s" in e for e in errors), errors
    assert most == 2  # (six at once without the slots)
    assert seen == 6


async def test_a_handshake_nobody_awaits_leaves_no_unretrieved_error() -> None:
    """A connect cancelled between the TCP connect and the wait for the handshake (its
    timeout under load) closes the transport: the handshake then fails with nobody
    awaiting it, and asyncio must not report "Future exception was never retrieved"
    (seen once per such connect in a 1000-cluster controller)."""
    import gc  # noqa: PLC0415

    from fleet.kube.http import _TlsProtocol  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        proto = _TlsProtocol(ssl.create_default_context(), "localhost",
                             asyncio.StreamReader())
        proto.connection_lost(None)  # closed before the handshake was awaited
        assert isinstance(proto.handshake.exception(), ConnectionResetError)
        proto = _TlsProtocol(ssl.create_default_context(), "localhost",
                             asyncio.StreamReader())
        proto.connection_lost(None)
        await asyncio.sleep(0)  # the done callbacks run
        del proto
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported


async def test_an_untrusted_server_fails_the_handshake_with_the_reason(
        server: TlsServer) -> None:
    c = HttpClient(f"https://127.0.0.1:{server.port}",
                   ssl_context=ssl.create_default_context())  # not our test CA
    with anyio.fail_after(DEADLINE), pytest.raises(HttpConnectionError,
                                                   match="CERTIFICATE_VERIFY_FAILED"):
        await c.request("GET", "/body/1")
    await c.close()


async def test_a_server_gone_mid_stream_ends_every_reader(server: TlsServer,
                                                          client: HttpClient) -> None:
    """Open streams and a request awaiting its answer when the server aborts every
    connection: each ends promptly with an error or the end of its body."""
    results: list[str] = []

    async def hang() -> None:
        try:
            await client.request("GET", "/hang", read_timeout=DEADLINE)
            results.append("answered")
        except (HttpConnectionError, TruncatedBodyError):
            results.append("error")

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(hang)
            while len(server._open) < 10:
                await anyio.sleep(0.01)
            for w in list(server._open):
                w.transport.abort()
    assert results == ["error"] * 10
