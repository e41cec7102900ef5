"""The one artifact resolver: which k0s binary (URL + sha256) a NodePlan names.

Every dispatch path (the controller's dispatcher and the runtime extension's
UpdateMachine) resolves through :class:`ArtifactResolver`, so both honour the same
``download:`` section, digest manifest included. The manifest is fetched once per URL
and kept (a release's sha256sums never change); a failed fetch is not kept, so the next
dispatch tries again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import anyio

from fleet.config.downloads import (
    DownloadResolutionError,
    digest_manifest_url,
    parse_digest_manifest,
    resolve_download,
)
from fleet.config.models import DownloadSettings

# Nodes always report their architecture; one not seen yet is taken to be this.
DEFAULT_ARCH = "amd64"
MANIFEST_TIMEOUT_SECONDS = 30.0

# URL -> the manifest's text. Production: :func:`fetch_text` (file:// and http(s)).
ManifestFetcher = Callable[[str], Awaitable[str]]


async def fetch_text(url: str) -> str:
    """The text at ``url`` (``file://`` or ``http(s)://``), through the proxy that
    ``HTTPS_PROXY`` / ``HTTP_PROXY`` name unless ``NO_PROXY`` exempts the host."""
    if url.startswith("file://"):
        return await anyio.Path(url.removeprefix("file://")).read_text()
    timeout = aiohttp.ClientTimeout(total=MANIFEST_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=True) as s, \
            s.get(url) as resp:
        resp.raise_for_status()
        return await resp.text()


@dataclass(frozen=True, slots=True)
class Artifact:
    """What a node is told to download: the URL, its sha256 (None only when unverified
    downloads are allowed) and whether it may be installed without one."""

    url: str
    sha256: str | None
    allow_unverified: bool


@dataclass
class ArtifactResolver:
    """URL and digest per (version, arch), from the fleet config and its digest manifest."""

    download: DownloadSettings = field(default_factory=DownloadSettings)
    fetch: ManifestFetcher = fetch_text
    _manifests: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    _lock: anyio.Lock = field(default_factory=anyio.Lock, repr=False)

    async def _manifest(self, version: str, arch: str) -> dict[str, str] | None:
        url = digest_manifest_url(self.download, version)
        if url is None:
            return None
        async with self._lock:  # one fetch per URL, however many nodes dispatch at once
            if url not in self._manifests:
                try:
                    self._manifests[url] = parse_digest_manifest(await self.fetch(url))
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
                    raise DownloadResolutionError(
                        f"digest manifest {url}: {e}", version=version, arch=arch) from e
            return self._manifests[url]

    async def resolve(self, version: str, arch: str | None = None) -> Artifact:
        """The artifact for k0s ``version`` on ``arch`` (None: :data:`DEFAULT_ARCH`).

        Raises :class:`fleet.config.downloads.DownloadResolutionError` saying what to configure.
        """
        arch = arch or DEFAULT_ARCH
        manifest = await self._manifest(version, arch)
        url, digest = resolve_download(self.download, version, arch, manifest=manifest)
        return Artifact(url=url, sha256=digest,
                        allow_unverified=digest is None and self.download.allow_unverified)
