"""Downloads against a loopback release server (no API server needed)."""
# ruff: noqa: ASYNC240  (tests read small tmp files synchronously on purpose)

from __future__ import annotations

import hashlib
import os
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp import web

from fleet.agents.download import DownloadPolicy, FinalDownloadError, ensure_staged
from fleet.agents.files import partial_path, staged_path
from fleet.testing.kubesim.certs import make_serving_cert
from fleet.testing.releases import Release, ReleaseServer

pytestmark = pytest.mark.anyio

FAST = DownloadPolicy(attempts=3, stall_timeout=0.5, overall_timeout=20, backoff_initial=0.05,
                      backoff_max=0.1, free_space_margin=0)


@pytest.fixture
async def rs() -> AsyncIterator[ReleaseServer]:
    async with ReleaseServer() as server:
        yield server


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    b = tmp_path / "bin" / "k0s"
    b.write_bytes(b"installed")
    return b


def leftovers(binary: Path) -> list[str]:
    return sorted(p.name for p in binary.parent.iterdir() if p.name != binary.name)


async def test_download_verifies_and_stages(rs: ReleaseServer, binary: Path) -> None:
    rel = rs.add("v1.32.1", size=3 * 1024 * 1024)
    res = await ensure_staged(rel.url, rel.sha256, binary, FAST)
    assert res.sha256 == rel.sha256 and res.bytes == len(rel.body) and not res.reused
    assert staged_path(binary).read_bytes() == rel.body
    assert os.access(staged_path(binary), os.X_OK)
    assert binary.read_bytes() == b"installed"
    assert leftovers(binary) == [staged_path(binary).name]
    again = await ensure_staged(rel.url, rel.sha256, binary, FAST)
    assert again.reused and rs.requests["v1.32.1"] == 1


async def test_404_is_final_without_retries(rs: ReleaseServer, binary: Path) -> None:
    with pytest.raises(FinalDownloadError, match="HTTP 404"):
        await ensure_staged(f"{rs.base_url}/k0s/nope", "a" * 64, binary, FAST)
    assert rs.requests["nope"] == 1
    assert leftovers(binary) == []


async def test_digest_mismatch_is_final_and_leaves_nothing(rs: ReleaseServer,
                                                           binary: Path) -> None:
    rel = rs.add("v1.32.1")
    rs.fail("v1.32.1", "wrong-bytes")
    with pytest.raises(FinalDownloadError, match=r"sha256 mismatch.*untouched"):
        await ensure_staged(rel.url, rel.sha256, binary, FAST)
    assert rs.requests["v1.32.1"] == 1
    assert binary.read_bytes() == b"installed" and leftovers(binary) == []


async def test_server_errors_are_retried(rs: ReleaseServer, binary: Path) -> None:
    rel = rs.add("v1.32.1")
    rs.fail("v1.32.1", "500", times=2)
    res = await ensure_staged(rel.url, rel.sha256, binary, FAST)
    assert res.attempts == 3 and rs.requests["v1.32.1"] == 3


async def test_persistent_stall_gives_up(rs: ReleaseServer, binary: Path) -> None:
    rel = rs.add("v1.32.1", size=1024 * 1024)
    rs.fail("v1.32.1", "stall")
    with pytest.raises(FinalDownloadError, match=r"giving up.*stalled"):
        await ensure_staged(rel.url, rel.sha256, binary, FAST)
    assert rs.requests["v1.32.1"] == FAST.attempts
    assert leftovers(binary) == []


@pytest.mark.parametrize("mode", ["stall", "truncate"])
async def test_interrupted_transfer_resumes_with_range(rs: ReleaseServer, binary: Path,
                                                       mode: str) -> None:
    rel = rs.add("v1.32.1", size=1024 * 1024)
    rs.fail("v1.32.1", mode, times=1)
    res = await ensure_staged(rel.url, rel.sha256, binary, FAST)
    assert res.sha256 == rel.sha256 and res.attempts == 2
    first, second = rs.ranges[-2:]
    assert first == ("v1.32.1", "")
    assert second[1].startswith("bytes=") and second[1] != "bytes=0-"


async def test_overall_timeout(rs: ReleaseServer, binary: Path) -> None:
    rel = rs.add("v1.32.1", size=1024 * 1024)
    rs.fail("v1.32.1", "stall")
    policy = DownloadPolicy(attempts=3, stall_timeout=30, overall_timeout=0.5)
    with pytest.raises(FinalDownloadError, match=r"did not finish within 0\.5s"):
        await ensure_staged(rel.url, rel.sha256, binary, policy)
    assert not partial_path(binary).exists()


async def test_size_limits(rs: ReleaseServer, binary: Path) -> None:
    rel = rs.add("v1.32.1", size=256 * 1024)
    small = DownloadPolicy(attempts=1, max_bytes=1000, free_space_margin=0)
    with pytest.raises(FinalDownloadError, match="above the 1000-byte limit"):
        await ensure_staged(rel.url, rel.sha256, binary, small)
    no_room = DownloadPolicy(attempts=1, free_space_margin=2**62)
    with pytest.raises(FinalDownloadError, match="not enough free space"):
        await ensure_staged(rel.url, rel.sha256, binary, no_room)
    assert leftovers(binary) == []


async def test_unreachable_server_is_retried_then_final(binary: Path) -> None:
    with pytest.raises(FinalDownloadError,
                       match=r"giving up on .* after 3 attempts: HttpConnectionError: connecting"):
        await ensure_staged("http://127.0.0.1:9/k0s", "a" * 64, binary, FAST)


async def test_unverified_download_reports_its_digest(rs: ReleaseServer, binary: Path) -> None:
    rel = rs.add("v1.32.1")
    res = await ensure_staged(rel.url, None, binary, FAST)
    assert res.sha256 == rel.sha256


def file_release(tmp_path: Path) -> tuple[Path, Release]:
    root = tmp_path / "releases"
    root.mkdir()
    body = b"#!/bin/sh\necho v1.32.1+k0s.0\n"
    (root / "k0s").write_bytes(body)
    sha = hashlib.sha256(body).hexdigest()
    return root, Release("v1.32.1+k0s.0", body, sha, f"file://{root}/k0s")


async def test_file_url_inside_root(tmp_path: Path, binary: Path) -> None:
    root, rel = file_release(tmp_path)
    policy = DownloadPolicy(attempts=1, file_url_roots=(root,), free_space_margin=0)
    res = await ensure_staged(rel.url, rel.sha256, binary, policy)
    assert staged_path(binary).read_bytes() == rel.body and res.bytes == len(rel.body)


async def test_file_url_symlink_escaping_root_is_refused(tmp_path: Path, binary: Path) -> None:
    root, _ = file_release(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:x:0:0")
    (root / "evil").symlink_to(secret)
    policy = DownloadPolicy(attempts=1, file_url_roots=(root,))
    with pytest.raises(FinalDownloadError, match="outside the allowed directories"):
        await ensure_staged(f"file://{root}/evil", None, binary, policy)
    with pytest.raises(FinalDownloadError, match="does not exist"):
        await ensure_staged(f"file://{root}/missing", None, binary, policy)
    assert leftovers(binary) == []


# -- redirects: every hop is judged ------------------------------------------------------------
@pytest.fixture
async def tls_redirector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                         ) -> AsyncIterator[Callable[[str], str]]:
    """An https server (its CA trusted through SSL_CERT_FILE, as an operator would) that
    redirects /go?to=<location>; yields a function giving the URL that redirects there."""
    cert = make_serving_cert(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert.ca))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert.cert, cert.key)

    async def go(request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": request.query["to"]})

    app = web.Application()
    app.router.add_get("/go", go)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield lambda location: f"https://127.0.0.1:{port}/go?to={quote(location, safe='')}"
    finally:
        await runner.cleanup()


async def test_redirect_from_https_to_http_is_refused(
        rs: ReleaseServer, binary: Path, tls_redirector: Callable[[str], str]) -> None:
    """A TLS download that a redirect would continue in clear text (where anyone on the
    path may replace the bytes) is refused before the http hop is requested."""
    rel = rs.add("v1.32.1")
    with pytest.raises(FinalDownloadError, match=r"from https to .*no downgrade to http"):
        await ensure_staged(tls_redirector(rel.url), rel.sha256, binary, FAST)
    assert rs.requests["v1.32.1"] == 0
    assert leftovers(binary) == []
    # an https hop is followed (to the same refusal of the http one: nothing else differs)
    with pytest.raises(FinalDownloadError, match="no downgrade"):
        await ensure_staged(tls_redirector(tls_redirector(rel.url)), rel.sha256, binary, FAST)
    assert rs.requests["v1.32.1"] == 0


async def test_every_redirect_hop_is_judged(rs: ReleaseServer, binary: Path) -> None:
    """With the agent's prefixes, a redirect to another origin is refused (nothing is
    fetched there); whatever the prefixes, a hop whose path has ``\\`` or other characters
    outside RFC 3986 is refused as such."""
    async with ReleaseServer() as other:
        target = other.add("v1.32.1")
        hop = rs.add("v1.32.9")
        rs.fail("v1.32.9", f"redirect:{target.url}")
        prefixes = DownloadPolicy(attempts=1, free_space_margin=0,
                                  url_prefixes=(f"{rs.base_url}/k0s/",))
        with pytest.raises(FinalDownloadError, match="not under any prefix"):
            await ensure_staged(hop.url, target.sha256, binary, prefixes)
        assert other.requests["v1.32.1"] == 0
        rs.fail("v1.32.9", "redirect:/k0s/..\\..\\v1.32.1")
        with pytest.raises(FinalDownloadError, match="outside RFC 3986"):
            await ensure_staged(hop.url, target.sha256, binary, FAST)
        # the request's own URL too
        with pytest.raises(FinalDownloadError, match="outside RFC 3986"):
            await ensure_staged(f"{rs.base_url}/k0s/v1.32.1\\x", target.sha256, binary, FAST)
        # a redirect under the prefixes is followed
        rs.add("v1.32.1")
        rs.fail("v1.32.9", f"redirect:{rs.base_url}/k0s/v1.32.1")
        res = await ensure_staged(hop.url, rs.releases["v1.32.1"].sha256, binary, prefixes)
        assert res.sha256 == rs.releases["v1.32.1"].sha256
