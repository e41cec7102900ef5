"""fleet.kube.http through an HTTP proxy (issue 29: air-gapped downloads).

``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` as curl and Go read them; https goes
through a CONNECT tunnel (TLS end to end, the proxy sees only the host and port), http
as absolute-form requests. A loopback proxy records what it was asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from fleet.kube.http import HttpClient, HttpConnectionError, proxy_from_environment
from fleet.testing.kubesim.certs import ServingCert, make_serving_cert

DEADLINE = 30.0


@pytest.mark.parametrize(("url", "env", "expected"), [
    ("https://dl.example.com/k0s", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
    ("https://dl.example.com/k0s", {"https_proxy": "p:3128"}, "http://p:3128"),
    ("https://dl.example.com/k0s", {"HTTP_PROXY": "http://p:3128"}, None),
    ("http://dl.example.com/k0s", {"HTTP_PROXY": "http://p:3128"}, "http://p:3128"),
    ("https://dl.example.com/k0s", {}, None),
    ("https://dl.example.com/k0s", {"HTTPS_PROXY": "http://p", "NO_PROXY": "example.com"},
     None),
    ("https://dl.example.com/k0s", {"HTTPS_PROXY": "http://p", "no_proxy": ".example.com"},
     None),
    ("https://dl.example.com/k0s", {"HTTPS_PROXY": "http://p", "NO_PROXY": "*.example.com"},
     None),
    ("https://badexample.com/k0s", {"HTTPS_PROXY": "http://p", "NO_PROXY": "example.com"},
     "http://p"),
    ("https://dl.example.com/k0s", {"HTTPS_PROXY": "http://p", "NO_PROXY": "*"}, None),
    ("https://10.1.2.3/k0s", {"HTTPS_PROXY": "http://p", "NO_PROXY": "10.0.0.0/8"}, None),
    ("https://11.1.2.3/k0s", {"HTTPS_PROXY": "http://p", "NO_PROXY": "10.0.0.0/8"},
     "http://p"),
    ("https://[fd00::1]/k0s", {"HTTPS_PROXY": "http://p", "NO_PROXY": "fd00::/8"}, None),
    ("https://dl.example.com:8443/k0s",
     {"HTTPS_PROXY": "http://p", "NO_PROXY": "dl.example.com:443"}, "http://p"),
    ("https://dl.example.com:8443/k0s",
     {"HTTPS_PROXY": "http://p", "NO_PROXY": "dl.example.com:8443"}, None),
    ("http://127.0.0.1:8080/k0s", {"HTTP_PROXY": "http://p"}, None),  # loopback: as Go
    ("http://localhost:8080/k0s", {"HTTP_PROXY": "http://p"}, None),
    ("https://[::1]/k0s", {"HTTPS_PROXY": "http://p"}, None),
    ("https://127.example.com/k0s", {"HTTPS_PROXY": "http://p"}, "http://p"),
])
def test_the_proxy_comes_from_the_environment(url: str, env: dict[str, str],
                                              expected: str | None) -> None:
    assert proxy_from_environment(url, env) == expected


@dataclass
class Proxy:
    """CONNECT tunnels to anywhere; absolute-form requests answered by itself."""

    asked: list[bytes] = field(default_factory=list)
    refuse: bool = False
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.asked.append(head)
            method, target, _ = head.split(b"\r\n", 1)[0].split(b" ")
            if self.refuse:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                             b"Content-Length: 0\r\n\r\n")
            elif method == b"CONNECT":
                host, port = target.rsplit(b":", 1)
                up_r, up_w = await asyncio.open_connection(host.decode(), int(port))
                self._writers.add(up_w)
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))
            else:
                body = b"proxied " + target
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.write_eof()


@contextlib.asynccontextmanager
async def proxy(refuse: bool = False) -> AsyncIterator[Proxy]:
    p = Proxy(refuse=refuse)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> ServingCert:
    return make_serving_cert(Path(tmp_path_factory.mktemp("tls")), cn="proxy-test")


@contextlib.asynccontextmanager
async def tls_origin(cert: ServingCert) -> AsyncIterator[int]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert.cert, cert.key)
    writers: set[asyncio.StreamWriter] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            body = b"origin saw " + head.split(b"\r\n", 1)[0]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            writers.discard(writer)
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for w in list(writers):
            w.transport.abort()
        await server.wait_closed()


@pytest.mark.anyio
async def test_https_goes_through_a_connect_tunnel(cert: ServingCert) -> None:
    async with proxy() as p, tls_origin(cert) as port:
        client = HttpClient(f"https://localhost:{port}", proxy=f"http://u:p%40ss@127.0.0.1:{p.port}",
                            ssl_context=ssl.create_default_context(cafile=str(cert.ca)))
        try:
            with anyio.fail_after(DEADLINE):
                resp = await client.request("GET", "/k0s?x=1")
                body = await resp.read()
                resp.release()
        finally:
            await client.close()
    assert (resp.status, body) == (200, b"origin saw GET /k0s?x=1 HTTP/1.1")
    [asked] = p.asked
    assert asked.startswith(b"CONNECT localhost:%d HTTP/1.1\r\n" % port)
    assert b"Proxy-Authorization: Basic dTpwQHNz\r\n" in asked  # u:p@ss
    assert b"/k0s" not in asked  # the path stays inside TLS


@pytest.mark.anyio
async def test_a_refused_tunnel_is_a_connection_error(cert: ServingCert) -> None:
    async with proxy(refuse=True) as p:
        client = HttpClient("https://localhost:1", proxy=f"http://127.0.0.1:{p.port}")
        try:
            with anyio.fail_after(DEADLINE), pytest.raises(HttpConnectionError, match="407"):
                await client.request("GET", "/")
        finally:
            await client.close()


@pytest.mark.anyio
async def test_http_goes_to_the_proxy_in_absolute_form() -> None:
    async with proxy() as p:
        client = HttpClient("http://mirror.internal:8080/base",
                            proxy=f"http://127.0.0.1:{p.port}")
        try:
            with anyio.fail_after(DEADLINE):
                resp = await client.request("GET", "/k0s")
                body = await resp.read()
                resp.release()
        finally:
            await client.close()
    assert body == b"proxied http://mirror.internal:8080/base/k0s"
    assert b"Host: mirror.internal:8080\r\n" in p.asked[0]


@pytest.mark.anyio
async def test_trust_env_reads_the_proxy_and_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    async with proxy() as p:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{p.port}")
        monkeypatch.setenv("NO_PROXY", "direct.internal")
        assert HttpClient("http://mirror.internal/", trust_env=True).proxy is not None
        assert HttpClient("http://direct.internal/", trust_env=True).proxy is None
        assert HttpClient("http://mirror.internal/").proxy is None  # only when asked


@pytest.mark.anyio
async def test_the_digest_manifest_is_fetched_through_the_proxy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.artifacts import fetch_text  # noqa: PLC0415

    async with proxy() as p:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{p.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with anyio.fail_after(DEADLINE):
            text = await fetch_text("http://mirror.internal/k0s/sha256sums.txt")
    assert text == "proxied http://mirror.internal/k0s/sha256sums.txt"


@pytest.mark.anyio
async def test_the_agent_downloads_through_the_proxy(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    import hashlib  # noqa: PLC0415

    from fleet.agents.download import DownloadPolicy, ensure_staged  # noqa: PLC0415

    url = "http://mirror.internal/k0s/v1.31.3+k0s.0/k0s"
    body = b"proxied " + url.encode()
    binary = tmp_path / "k0s"
    binary.write_bytes(b"installed")
    async with proxy() as p:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{p.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with anyio.fail_after(DEADLINE):
            result = await ensure_staged(url, hashlib.sha256(body).hexdigest(), binary,
                                         DownloadPolicy(attempts=1, free_space_margin=0))
    assert result.path.read_bytes() == body
    assert p.asked[0].startswith(f"GET {url} HTTP/1.1\r\n".encode())
