"""Download resolution: the pure rules (:mod:`fleet.config.downloads`) and the one resolver every
dispatch path uses (:mod:`fleet.artifacts`), digest manifest included."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleet.artifacts import ArtifactResolver
from fleet.config.downloads import (
    DigestConflictError,
    DigestManifestError,
    DownloadResolutionError,
    MissingDigestError,
    UnsupportedArchError,
    digest_manifest_url,
    parse_digest_manifest,
    resolve_download,
)
from fleet.config.models import DownloadSettings, FleetConfig

SHA_A = "a" * 64
SHA_B = "b" * 64
MANIFEST_URL = "https://example.com/{version}/sha256sums.txt"



def test_parse_digest_manifest() -> None:
    text = f"""
    # k0s v1.31.3+k0s.0
    {SHA_A}  k0s-v1.31.3+k0s.0-amd64
    {SHA_B.upper()} *./k0s-v1.31.3+k0s.0-arm64

    SHA256 (k0s-v1.31.3+k0s.0-arm) = {SHA_A}
    """
    assert parse_digest_manifest(textwrap.dedent(text)) == {
        "k0s-v1.31.3+k0s.0-amd64": SHA_A,
        "k0s-v1.31.3+k0s.0-arm64": SHA_B,
        "k0s-v1.31.3+k0s.0-arm": SHA_A,
    }


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("nonsense\n", "line 1: not a sha256sum line"),
        (f"{SHA_A[:-2]}  f\n", "line 1: not a sha256sum line"),
        (f"{SHA_A}  f\n{SHA_B}  f\n", "line 2: 'f' listed with two different digests"),
    ],
)
def test_bad_digest_manifest(text: str, fragment: str) -> None:
    with pytest.raises(DigestManifestError, match=fragment):
        parse_digest_manifest(text)


def test_resolve_download_pinned_digest() -> None:
    cfg = FleetConfig.model_validate(
        {"download": {"digests": {"v1.31.3": {"amd64": SHA_A.upper()}}}}
    )
    url, digest = resolve_download(cfg.download, "1.31.3+k0s.0", "amd64")
    assert url == "https://get.k0sproject.io/v1.31.3+k0s.0/k0s-v1.31.3+k0s.0-amd64"
    assert digest == SHA_A


def test_resolve_download_from_manifest() -> None:
    cfg = FleetConfig.model_validate(
        {"download": {"digestManifestUrl": "https://example.com/{version}/sha256sums.txt"}}
    )
    assert digest_manifest_url(cfg.download, "v1.31.3") == "https://example.com/v1.31.3+k0s.0/sha256sums.txt"
    manifest = parse_digest_manifest(f"{SHA_B}  k0s-v1.31.3+k0s.0-arm64\n")
    assert resolve_download(cfg.download, "v1.31.3", "arm64", manifest=manifest)[1] == SHA_B
    with pytest.raises(MissingDigestError, match="not consulted"):
        resolve_download(cfg.download, "v1.31.3", "arm64")
    with pytest.raises(MissingDigestError, match=r"does not list 'k0s-v1\.31\.3\+k0s\.0-amd64'"):
        resolve_download(cfg.download, "v1.31.3", "amd64", manifest=manifest)


def test_resolve_download_refuses_unverified_unless_allowed() -> None:
    with pytest.raises(MissingDigestError) as e:
        resolve_download(DownloadSettings(), "v1.31.3", "amd64")
    assert (e.value.version, e.value.arch) == ("v1.31.3+k0s.0", "amd64")
    allowed = FleetConfig.model_validate({"download": {"allowUnverified": True}})
    assert resolve_download(allowed.download, "v1.31.3", "arm")[1] is None


def test_resolve_download_conflict_and_arch() -> None:
    cfg = FleetConfig.model_validate({"download": {"digests": {"v1.31.3": {"amd64": SHA_A}}}})
    manifest = {"k0s-v1.31.3+k0s.0-amd64": SHA_B}
    with pytest.raises(DigestConflictError):
        resolve_download(cfg.download, "v1.31.3", "amd64", manifest=manifest)
    with pytest.raises(UnsupportedArchError):
        resolve_download(cfg.download, "v1.31.3", "riscv64")


def test_file_url_template() -> None:
    cfg = FleetConfig.model_validate(
        {
            "download": {
                "urlTemplate": "file:///srv/k0s/{version}/{arch}/k0s",
                "allowUnverified": True,
            }
        }
    )
    assert resolve_download(cfg.download, "v1.30.1", "amd64") == (
        "file:///srv/k0s/v1.30.1+k0s.0/amd64/k0s",
        None,
    )


@pytest.mark.anyio
async def test_resolver_follows_the_fleet_download_policy() -> None:
    with pytest.raises(MissingDigestError, match="no sha256"):
        await ArtifactResolver().resolve("v1.32.1-k0s.0")
    pinned = ArtifactResolver(DownloadSettings(digests={"v1.32.1+k0s.0": {"arm64": SHA_A}}))
    a = await pinned.resolve("v1.32.1-k0s.0", "arm64")
    assert a.url == "https://get.k0sproject.io/v1.32.1+k0s.0/k0s-v1.32.1+k0s.0-arm64"
    assert a.sha256 == SHA_A and not a.allow_unverified
    with pytest.raises(UnsupportedArchError, match="architecture"):
        await pinned.resolve("v1.32.1-k0s.0", "riscv64")
    loose = await ArtifactResolver(DownloadSettings(allow_unverified=True)).resolve("v1.32.1")
    assert loose.sha256 is None and loose.allow_unverified and loose.url.endswith("-amd64")


@pytest.mark.anyio
async def test_resolver_fetches_each_manifest_once_and_retries_failures() -> None:
    fetched: list[str] = []
    fail = [True]

    async def fetch(url: str) -> str:
        fetched.append(url)
        if fail[0]:
            raise OSError("connection refused")
        return f"{SHA_B}  k0s-v1.32.1+k0s.0-amd64\n"

    resolver = ArtifactResolver(DownloadSettings(digest_manifest_url=MANIFEST_URL), fetch)
    with pytest.raises(DownloadResolutionError, match="connection refused"):
        await resolver.resolve("v1.32.1")
    fail[0] = False
    assert (await resolver.resolve("v1.32.1")).sha256 == SHA_B
    assert (await resolver.resolve("v1.32.1", "amd64")).sha256 == SHA_B
    assert fetched == ["https://example.com/v1.32.1+k0s.0/sha256sums.txt"] * 2
    with pytest.raises(MissingDigestError, match="does not list"):
        await resolver.resolve("v1.32.1", "arm64")


@pytest.mark.anyio
async def test_resolver_reads_file_manifests(tmp_path: Path) -> None:
    (tmp_path / "v1.32.1+k0s.0").mkdir()
    (tmp_path / "v1.32.1+k0s.0" / "sha256sums.txt").write_text(
        f"{SHA_A}  k0s-v1.32.1+k0s.0-amd64\n")
    resolver = ArtifactResolver(DownloadSettings(
        digest_manifest_url=f"file://{tmp_path}/{{version}}/sha256sums.txt"))
    assert (await resolver.resolve("v1.32.1")).sha256 == SHA_A
    bad = ArtifactResolver(DownloadSettings(
        digest_manifest_url=f"file://{tmp_path}/missing/{{version}}"))
    with pytest.raises(DownloadResolutionError, match="digest manifest file://"):
        await bad.resolve("v1.32.1")
