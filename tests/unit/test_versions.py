import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.contract.versions import InvalidVersionError, K0sVersion, normalize, same_version


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("v1.31.3+k0s.0", "v1.31.3+k0s.0"),
        ("v1.31.3", "v1.31.3+k0s.0"),
        ("1.31.3", "v1.31.3+k0s.0"),
        ("v1.31.3-k0s.1", "v1.31.3+k0s.1"),
        (" v1.30.10+k0s.2 ", "v1.30.10+k0s.2"),
        ("v1.32.0-rc.1+k0s.0", "v1.32.0-rc.1+k0s.0"),
        ("v1.32.0-rc.1", "v1.32.0-rc.1+k0s.0"),
    ],
)
def test_normalize(raw: str, canonical: str) -> None:
    assert normalize(raw) == canonical


@pytest.mark.parametrize(
    "bad", ["", "latest", "v1.31", "v1.31.3+k3s.0", "v01.2.3", "v1.2.3+k0s.", "v1.2.3 extra", "x"]
)
def test_invalid(bad: str) -> None:
    with pytest.raises(InvalidVersionError, match="not a k0s version"):
        K0sVersion.parse(bad)


def test_same_version_spellings() -> None:
    assert same_version("v1.31.3", "v1.31.3+k0s.0")
    assert same_version("v1.31.3-k0s.0", "1.31.3+k0s.0")
    assert not same_version("v1.31.3+k0s.1", "v1.31.3+k0s.0")
    assert not same_version(None, "v1.31.3")
    assert not same_version("garbage", "garbage")


def test_ordering() -> None:
    order = ["v1.30.9", "v1.31.0-rc.1", "v1.31.0", "v1.31.0+k0s.1", "v1.31.2", "v2.0.0"]
    parsed = [K0sVersion.parse(v) for v in order]
    assert sorted(reversed(parsed)) == parsed


versions = st.builds(
    K0sVersion,
    major=st.integers(0, 40), minor=st.integers(0, 40), patch=st.integers(0, 40),
    k0s=st.integers(0, 9), pre=st.none() | st.from_regex(r"(rc|beta|alpha)\.[1-9]", fullmatch=True),
)


@given(versions)
def test_roundtrip(v: K0sVersion) -> None:
    assert K0sVersion.parse(str(v)) == v
    assert K0sVersion.parse(str(v).replace("+k0s.", "-k0s.")) == v
