"""k0s version strings: the one place that parses and normalises them.

k0s versions look like ``v1.31.3+k0s.0``. Cluster API objects carry them in
``spec.version``; k0smotron reads a missing ``+k0s.N`` suffix as ``+k0s.0`` and
accepts ``-k0s.`` as another spelling of ``+k0s.``. Every comparison in the project
goes through :class:`K0sVersion` so that those spellings compare equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache, total_ordering

_VERSION = re.compile(
    r"^v?(?P<major>0|[1-9]\d*)\.(?P<minor>0|[1-9]\d*)\.(?P<patch>0|[1-9]\d*)"
    r"(?:-(?P<pre>(?!k0s\.)[0-9A-Za-z.-]+?))?"
    r"(?:[+-]k0s\.(?P<k0s>0|[1-9]\d*))?$"
)


class InvalidVersionError(ValueError):
    """A string that is not a k0s version."""

    def __init__(self, value: object) -> None:
        super().__init__(f"not a k0s version: {value!r} (expected e.g. v1.31.3+k0s.0)")
        self.value = value


@total_ordering
@dataclass(frozen=True, slots=True)
class K0sVersion:
    major: int
    minor: int
    patch: int
    k0s: int = 0
    pre: str | None = None

    @classmethod
    def parse(cls, value: str) -> K0sVersion:
        if not isinstance(value, str):
            raise InvalidVersionError(value)
        m = _VERSION.match(value.strip())
        if m is None:
            raise InvalidVersionError(value)
        return cls(
            major=int(m["major"]),
            minor=int(m["minor"]),
            patch=int(m["patch"]),
            k0s=int(m["k0s"] or 0),
            pre=m["pre"],
        )

    def __str__(self) -> str:
        pre = f"-{self.pre}" if self.pre else ""
        return f"v{self.major}.{self.minor}.{self.patch}{pre}+k0s.{self.k0s}"

    def _key(self) -> tuple[int, int, int, int, int, str]:
        # A pre-release sorts before the release it precedes.
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, self.k0s, self.pre or "")

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, K0sVersion):
            return NotImplemented
        return self._key() < other._key()

    @property
    def url_segment(self) -> str:
        """The spelling used in download URLs (``+`` is kept; servers expect it)."""
        return str(self)


def parse_or_none(value: object) -> K0sVersion | None:
    """``value`` as a K0sVersion, or None when it is empty or not a k0s version."""
    if isinstance(value, K0sVersion):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        return K0sVersion.parse(value)
    except InvalidVersionError:
        return None


def normalize(value: str) -> str:
    """The canonical spelling of a k0s version string."""
    return str(K0sVersion.parse(value))


_KUBE_RELEASE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def kubernetes_release(version: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a k0s or kubelet version string; None when unparseable."""
    if not version or not isinstance(version, str):
        return None
    m = _KUBE_RELEASE.match(version.strip())
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]))


@lru_cache(maxsize=4096)
def valid_version(value: str | None) -> str | None:
    """The canonical spelling of ``value``, or None when it is empty or not a k0s version."""
    if not value or not isinstance(value, str):
        return None
    try:
        return normalize(value)
    except InvalidVersionError:
        return None


def same_version(a: str | None, b: str | None) -> bool:
    """True when both are versions and name the same k0s release."""
    if a is None or b is None:
        return False
    try:
        return K0sVersion.parse(a) == K0sVersion.parse(b)
    except InvalidVersionError:
        return False
