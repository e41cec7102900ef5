"""Which k0s binary a node downloads, and how it is verified: pure resolution.

:func:`resolve_download` turns the fleet config's ``download:`` section (plus, when one is
configured, the parsed digest manifest) into a URL and a sha256. Fetching the manifest is
I/O and lives in :mod:`fleet.artifacts`, the one resolver every dispatch path uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from fleet.config.models import DownloadSettings
from fleet.contract.versions import K0sVersion


class DownloadResolutionError(ValueError):
    """No acceptable download for a version and architecture."""

    def __init__(self, message: str, *, version: str, arch: str) -> None:
        super().__init__(message)
        self.version = version
        self.arch = arch


class UnsupportedArchError(DownloadResolutionError):
    pass


class MissingDigestError(DownloadResolutionError):
    pass


class DigestConflictError(DownloadResolutionError):
    pass


class DigestManifestError(ValueError):
    """A digest manifest that is not a sha256sums-style file."""


_SUMS_LINE = re.compile(r"(?P<d>[0-9a-fA-F]{64}) [ *](?P<f>.+)")
_BSD_LINE = re.compile(r"SHA256 \((?P<f>.+)\) = (?P<d>[0-9a-fA-F]{64})")


def parse_digest_manifest(text: str) -> dict[str, str]:
    """File name -> sha256 from a ``sha256sum`` output (``<hex>  <name>`` or
    ``<hex> *<name>``) or its BSD form (``SHA256 (<name>) = <hex>``). Blank lines and
    ``#`` comments are skipped; a leading ``./`` is dropped from names.
    """
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SUMS_LINE.fullmatch(line) or _BSD_LINE.fullmatch(line)
        if m is None:
            raise DigestManifestError(f"line {n}: not a sha256sum line: {raw[:80]!r}")
        name = m["f"].strip().removeprefix("./")
        digest = m["d"].lower()
        if out.get(name, digest) != digest:
            raise DigestManifestError(f"line {n}: {name!r} listed with two different digests")
        out[name] = digest
    return out


def digest_manifest_url(d: DownloadSettings, version: str) -> str | None:
    """The digest manifest URL for ``version``, if one is configured."""
    if d.digest_manifest_url is None:
        return None
    return d.digest_manifest_url.format(version=K0sVersion.parse(version).url_segment)


def resolve_download(
    d: DownloadSettings,
    version: str,
    arch: str,
    *,
    manifest: Mapping[str, str] | None = None,
) -> tuple[str, str | None]:
    """The URL and sha256 of the k0s binary for ``version`` on ``arch``.

    The digest comes from ``download.digests`` or else from ``manifest`` (the parsed
    digest manifest, fetched by the caller), looked up by the URL's file name. When both
    know the binary they must agree. Without a digest, the result is ``(url, None)`` only
    if ``allowUnverified`` is set; otherwise :class:`MissingDigestError`.
    """
    v = K0sVersion.parse(version)
    if arch not in d.arches:
        raise UnsupportedArchError(
            f"architecture {arch!r} is not in download.arches ({', '.join(d.arches)})",
            version=str(v),
            arch=arch,
        )
    url = d.url_template.format(version=v.url_segment, arch=arch)
    pinned = d.digests.get(str(v), {}).get(arch)
    listed = None
    if manifest is not None:
        filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        listed = manifest.get(filename)
        if listed is not None:
            listed = listed.lower()
    if pinned is not None and listed is not None and pinned != listed:
        raise DigestConflictError(
            f"download.digests[{str(v)!r}].{arch} ({pinned}) differs from the digest "
            f"manifest ({listed}) for {url}",
            version=str(v),
            arch=arch,
        )
    digest = pinned or listed
    if digest is None and not d.allow_unverified:
        if manifest is not None:
            hint = f"the digest manifest does not list {url.rsplit('/', 1)[-1]!r} either"
        elif d.digest_manifest_url is not None:
            hint = "the digest manifest was not consulted (pass manifest=)"
        else:
            hint = "set download.digestManifestUrl or download.allowUnverified: true"
        raise MissingDigestError(
            f"no sha256 known for k0s {v} {arch} ({url}) in download.digests; {hint}",
            version=str(v),
            arch=arch,
        )
    return url, digest
