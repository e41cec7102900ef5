"""The parts of fleet.contract.signal the agent added: status replacement, rejection digest,
URLs."""

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.contract.signal import (
    SIGNAL_DATA_KEY,
    InvalidSignalError,
    SignalState,
    SignalStatus,
    parse_signal,
    replace_status,
    request_part,
    signal_digest,
)

# The agent chart's admission policy (templates/signal-policy.yaml) accepts a write by
# anyone but the controller when the new value is the old request part followed by this.
POLICY_SUFFIX = re.compile(r'^(,"status":\{[^{}]*\})?\}$')

SHA = "b" * 64


def raw_request(url: str = "https://r.example/k0s", **extra: object) -> str:
    return json.dumps({
        "planId": "p1", "created": "2026-11-30T10:00:00Z",
        "command": {"id": 0, "k0supdate": {"url": url, "version": "v1.31.3", "sha256": SHA}},
        **extra,
    })


def test_replace_status_keeps_unknown_request_fields() -> None:
    raw = raw_request(futureField={"x": 1})
    out = replace_status(raw, SignalStatus(status=SignalState.CORDONING, sha256=SHA))
    data = json.loads(out)
    assert data["futureField"] == {"x": 1}
    assert data["status"]["status"] == "Cordoning"
    parsed = parse_signal({SIGNAL_DATA_KEY: out})
    assert parsed is not None and parsed.status is not None
    assert parsed.status.sha256 == SHA
    assert parsed.status.status is SignalState.CORDONING


def test_replace_status_refuses_non_objects() -> None:
    with pytest.raises(InvalidSignalError):
        replace_status("[1]", SignalStatus(status=SignalState.DOWNLOADING))


def test_digest_distinguishes_values() -> None:
    assert signal_digest("a") != signal_digest("b")
    assert signal_digest("a") == signal_digest("a")
    assert signal_digest("\udcff") == signal_digest("\udcff")  # never raises


def test_failed_apply_is_terminal_failure() -> None:
    assert SignalState.FAILED_APPLY.failed and SignalState.FAILED_APPLY.terminal


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("https:///k0s", "no host"),
        ("http://[::1/k0s", "malformed"),
        ("http://h:99999/k0s", "malformed"),
        ("file://evil.example/etc/shadow", "host"),
        ("file:relative/k0s", "absolute"),
        ("https://h/k0s\nX-Injected: 1", "control"),
        ("javascript:alert(1)", "scheme"),
        ("data:application/octet-stream;base64,AAAA", "scheme"),
        ("//h/k0s", "scheme"),
    ],
)
def test_structurally_bad_urls(url: str, needle: str) -> None:
    with pytest.raises(InvalidSignalError, match=needle):
        parse_signal({SIGNAL_DATA_KEY: raw_request(url)})


@pytest.mark.parametrize("url", ["file:///opt/k0s/k0s-v1.31.3", "file://localhost/opt/k0s",
                                 "http://127.0.0.1:8080/k0s", "https://get.k0sproject.io/v/k0s"])
def test_acceptable_urls(url: str) -> None:
    assert parse_signal({SIGNAL_DATA_KEY: raw_request(url)}) is not None


@given(reason=st.text(max_size=80), first=st.text(max_size=40))
def test_status_writes_keep_the_request_part_byte_for_byte(reason: str, first: str) -> None:
    """What the admission policy checks: the controller's bytes, then only a status."""
    raw = json.dumps({"planId": "p1", "created": "2026-11-30T10:00:00Z", "note": "ü {x}",
                      "command": {"id": 0, "k0supdate": {
                          "url": "https://r.example/k0s", "version": "v1.31.3",
                          "sha256": SHA}}}, ensure_ascii=False, separators=(",", ":"))
    request = request_part(raw)
    assert request is not None and raw == request + "}"
    mid = replace_status(raw, SignalStatus(status=SignalState.DOWNLOADING, reason=first))
    out = replace_status(mid, SignalStatus(status=SignalState.FAILED_DOWNLOAD, reason=reason))
    for value in (mid, out):
        assert value.startswith(request) and request_part(value) == request
        assert POLICY_SUFFIX.match(value[len(request):]), value[len(request):]
    parsed = parse_signal({SIGNAL_DATA_KEY: out})
    assert parsed is not None and parsed.status is not None and parsed.status.reason == reason


def test_a_second_command_after_the_status_is_refused() -> None:
    out = replace_status(raw_request(), SignalStatus(status=SignalState.DOWNLOADING))
    evil = out[:-1] + ',"command":{"id":0,"k0supdate":{"url":"https://evil.example/k0s"}}}'
    with pytest.raises(InvalidSignalError, match="twice"):
        parse_signal({SIGNAL_DATA_KEY: evil})
