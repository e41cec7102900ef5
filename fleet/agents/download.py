"""Download a release binary next to the installed one, verified, durably staged.

The bytes stream into a hidden file in the binary's own directory (so that the later
rename is atomic), hashed on the way; the file is fsync'd, checked against the
requested sha256 and only then renamed to the staged name. Transient failures (no
connection, 5xx, a stalled or truncated transfer) are retried with backoff, resuming
with a Range request when the server supports it; a 4xx, a digest mismatch or a lack
of disk space is final. The installed binary is never touched here.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urljoin, urlsplit

import anyio

from fleet.agents.files import (
    CHUNK,
    fsync_dir,
    partial_path,
    sha256_file,
    staged_path,
    unlink_quiet,
)
from fleet.agents.state import redirect_problem, url_problem
from fleet.kube.backoff import Backoff
from fleet.kube.http import HttpClient, Response, TruncatedBodyError

log = logging.getLogger(__name__)


class DownloadError(Exception):
    """A download that did not produce a verified staged binary."""


class FinalDownloadError(DownloadError):
    """Retrying cannot help (4xx, digest mismatch, no space, refused source)."""


class TransientDownloadError(DownloadError):
    """Worth another attempt (connection, 5xx, stall, truncation)."""


@dataclass(frozen=True, slots=True)
class DownloadPolicy:
    attempts: int = 5
    stall_timeout: float = 30.0
    overall_timeout: float = 900.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    max_bytes: int = 2 * 1024**3
    free_space_margin: int = 64 * 1024**2
    file_url_roots: tuple[Path, ...] = ()
    # http(s) URLs every hop (the request's URL and each redirect) must lie under; None:
    # any origin (the URL itself was judged by the caller). Either way each hop must be
    # RFC 3986 clean and https is never followed to http.
    url_prefixes: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class DownloadResult:
    path: Path
    sha256: str
    bytes: int
    attempts: int
    seconds: float
    reused: bool = False


class _Sink:
    """The partial file plus the running hash of exactly what it holds."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.fh: IO[bytes] = open(path, "wb")  # noqa: SIM115 (closed by close())
        os.chmod(path, 0o755)
        self.hasher = hashlib.sha256()
        self.written = 0

    def reset(self) -> None:
        self.fh.seek(0)
        self.fh.truncate()
        self.hasher = hashlib.sha256()
        self.written = 0

    def write(self, chunk: bytes) -> None:
        if self.written + len(chunk) > self.max_bytes:
            raise FinalDownloadError(f"download exceeds the {self.max_bytes}-byte limit")
        try:
            self.fh.write(chunk)
        except OSError as e:
            raise FinalDownloadError(f"cannot write {self.path}: {e.strerror or e}") from e
        self.hasher.update(chunk)
        self.written += len(chunk)

    def sync_and_close(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()

    def close(self) -> None:
        if not self.fh.closed:
            self.fh.close()


def resolve_file_source(url: str, roots: tuple[Path, ...]) -> Path:
    """The real path a file: URL reads, refusing anything outside ``roots``.

    Resolved through symlinks, so a link placed inside a trusted directory cannot
    point the agent at a file outside it.
    """
    raw = Path(unquote(urlsplit(url).path))
    real = Path(os.path.realpath(raw))
    for root in roots:
        real_root = Path(os.path.realpath(root))
        if real == real_root or real_root in real.parents:
            return real
    raise FinalDownloadError(f"{url} resolves to {real}, outside the allowed directories")


async def ensure_staged(url: str, expected_sha256: str | None, binary: Path,
                        policy: DownloadPolicy) -> DownloadResult:
    """Make the staged file hold the requested binary; idempotent.

    With an expected digest, a staged file that already has it is reused as is.
    """
    staged = staged_path(binary)
    t0 = time.monotonic()
    if expected_sha256 is not None:
        have = await anyio.to_thread.run_sync(sha256_file, staged)
        if have == expected_sha256:
            return DownloadResult(path=staged, sha256=have, bytes=staged.stat().st_size,
                                  attempts=0, seconds=time.monotonic() - t0, reused=True)
    part = partial_path(binary)
    sink = _Sink(part, policy.max_bytes)
    moved = False
    try:
        with anyio.fail_after(policy.overall_timeout):
            attempts = await _fetch_with_retries(url, sink, binary.parent, policy)
        await anyio.to_thread.run_sync(sink.sync_and_close)
        digest = sink.hasher.hexdigest()
        if expected_sha256 is not None and digest != expected_sha256:
            raise FinalDownloadError(
                f"sha256 mismatch for {url}: expected {expected_sha256}, got {digest} "
                f"({sink.written} bytes); the installed binary is untouched"
            )
        os.replace(part, staged)
        moved = True
        await anyio.to_thread.run_sync(fsync_dir, binary.parent)
        return DownloadResult(path=staged, sha256=digest, bytes=sink.written,
                              attempts=attempts, seconds=time.monotonic() - t0)
    except TimeoutError:
        raise FinalDownloadError(
            f"download of {url} did not finish within {policy.overall_timeout:g}s "
            f"({sink.written} bytes received)"
        ) from None
    finally:
        sink.close()
        if not moved:
            unlink_quiet(part)


async def _fetch_with_retries(url: str, sink: _Sink, directory: Path,
                              policy: DownloadPolicy) -> int:
    scheme = urlsplit(url).scheme.lower()
    backoff = Backoff(initial=policy.backoff_initial, maximum=policy.backoff_max)
    last: TransientDownloadError | None = None
    for attempt in range(1, policy.attempts + 1):
        try:
            if scheme == "file":
                await _copy_file(url, sink, directory, policy)
            elif scheme in ("http", "https"):
                await _fetch_http(url, sink, directory, policy)
            else:
                raise FinalDownloadError(f"unsupported URL scheme {scheme!r}")
            return attempt
        except TransientDownloadError as e:
            last = e
            if attempt == policy.attempts:
                break
            delay = backoff.next_delay()
            log.warning("download attempt %d/%d of %s failed (%s); retrying in %.1fs",
                        attempt, policy.attempts, url, e, delay)
            await anyio.sleep(delay)
    raise FinalDownloadError(f"giving up on {url} after {policy.attempts} attempts: {last}")


def _check_space(directory: Path, incoming: int, policy: DownloadPolicy) -> None:
    if incoming > policy.max_bytes:
        raise FinalDownloadError(
            f"server announces {incoming} bytes, above the {policy.max_bytes}-byte limit"
        )
    free = shutil.disk_usage(directory).free
    if free < incoming + policy.free_space_margin:
        raise FinalDownloadError(
            f"not enough free space in {directory}: need {incoming} bytes plus a "
            f"{policy.free_space_margin}-byte margin, have {free}"
        )


MAX_REDIRECTS = 10
REDIRECTS = (301, 302, 303, 307, 308)


async def _open_following_redirects(url: str, headers: dict[str, str],
                                    policy: DownloadPolicy) -> tuple[HttpClient, Response]:
    """GET ``url``, following redirects to http(s) URLs; the caller releases and closes.

    Every hop is judged before it is requested (:func:`fleet.agents.state.redirect_problem`):
    a refused hop is final, nothing is fetched from it."""
    problem = url_problem(url)
    if problem is None and policy.url_prefixes is not None:
        problem = redirect_problem(url, url, policy.url_prefixes)
    if problem:
        raise FinalDownloadError(f"refusing to download {url}: {problem}")
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(current)
        # trust_env: through HTTPS_PROXY / HTTP_PROXY unless NO_PROXY exempts the host
        client = HttpClient(f"{parts.scheme}://{parts.netloc}",
                            connect_timeout=policy.stall_timeout, pool_size=0, trust_env=True)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            resp = await client.request("GET", target, headers=headers,
                                        read_timeout=policy.stall_timeout)
        except BaseException:
            await client.close()
            raise
        location = resp.headers.get("location")
        if resp.status not in REDIRECTS or not location:
            return client, resp
        resp.release()
        await client.close()
        following = urljoin(current, location)
        if urlsplit(following).scheme.lower() not in ("http", "https"):
            raise FinalDownloadError(f"{url} redirects to a non-http(s) URL: {following}")
        problem = redirect_problem(current, following, policy.url_prefixes)
        if problem:
            log.warning("download of %s refused: %s", url, problem)
            raise FinalDownloadError(f"{url}: {problem}")
        current = following
    raise FinalDownloadError(f"{url}: more than {MAX_REDIRECTS} redirects")


async def _fetch_http(url: str, sink: _Sink, directory: Path, policy: DownloadPolicy) -> None:
    headers = {"Accept-Encoding": "identity", "User-Agent": "k0s-fleet-agent"}
    if sink.written:
        headers["Range"] = f"bytes={sink.written}-"
    try:
        client, resp = await _open_following_redirects(url, headers, policy)
        try:
            resumed_at = _range_start(resp.headers.get("content-range"))
            reason = f"HTTP {resp.status} {resp.reason or ''}".strip()
            if resp.status == 206 and resumed_at == sink.written:
                log.info("resuming %s at byte %d", url, sink.written)
            elif resp.status == 200:
                sink.reset()
            elif resp.status in (408, 429) or resp.status >= 500:
                raise TransientDownloadError(reason)
            elif resp.status in (416, 206):
                sink.reset()  # the server cannot resume where we are: start over
                raise TransientDownloadError(f"HTTP {resp.status}: cannot resume, restarting")
            else:
                raise FinalDownloadError(f"{reason} for {url}")
            if resp.content_length is not None:
                _check_space(directory, resp.content_length, policy)
            async for chunk in resp.iter_chunks(CHUNK):
                sink.write(chunk)
        finally:
            resp.release()
            await client.close()
    except DownloadError:
        raise
    except TimeoutError as e:
        raise TransientDownloadError(
            f"transfer stalled: no data for {policy.stall_timeout:g}s "
            f"({sink.written} bytes received)"
        ) from e
    except TruncatedBodyError as e:
        raise TransientDownloadError(f"truncated transfer after {sink.written} bytes: {e}") from e
    except (ValueError, OSError) as e:
        raise TransientDownloadError(f"{type(e).__name__}: {e}") from e


def _range_start(content_range: str | None) -> int | None:
    # "bytes 100-199/200"
    if not content_range or not content_range.startswith("bytes "):
        return None
    try:
        return int(content_range[6:].split("-", 1)[0])
    except ValueError:
        return None


async def _copy_file(url: str, sink: _Sink, directory: Path, policy: DownloadPolicy) -> None:
    src_path = resolve_file_source(url, policy.file_url_roots)
    sink.reset()
    try:
        src = await anyio.to_thread.run_sync(lambda: open(src_path, "rb"))  # noqa: SIM115
    except FileNotFoundError:
        raise FinalDownloadError(f"{src_path} does not exist") from None
    except OSError as e:
        raise FinalDownloadError(f"cannot read {src_path}: {e.strerror or e}") from None
    try:
        size = os.fstat(src.fileno()).st_size
        _check_space(directory, size, policy)
        while chunk := await anyio.to_thread.run_sync(src.read, CHUNK):
            sink.write(chunk)
    except OSError as e:
        raise TransientDownloadError(f"reading {src_path}: {e}") from e
    finally:
        with contextlib.suppress(OSError):
            src.close()
