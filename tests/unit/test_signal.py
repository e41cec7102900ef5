import json

import pytest

from fleet.contract.signal import (
    SIGNAL_DATA_KEY,
    SIGNAL_VERSION_KEY,
    InvalidSignalError,
    SignalData,
    SignalState,
    SignalStatus,
    parse_signal,
    signal_annotations,
)

SHA = "a" * 64


def request(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "planId": "md-1-v1.31.3-k0s.0",
        "created": "2026-11-30T10:00:00Z",
        "command": {"id": 0, "k0supdate": {"url": "https://r.example/k0s", "version": "v1.31.3",
                                           "sha256": SHA}},
    }
    base.update(over)
    return base


def test_no_signal() -> None:
    assert parse_signal({}) is None
    assert parse_signal(None) is None


def test_roundtrip_and_normalisation() -> None:
    data = parse_signal({SIGNAL_DATA_KEY: json.dumps(request())})
    assert data is not None
    assert data.command.k0supdate.version == "v1.31.3+k0s.0"
    again = parse_signal(signal_annotations(data))
    assert again == data
    updated = data.with_status(SignalStatus(status=SignalState.DOWNLOADING))
    assert updated.same_request(data)
    assert parse_signal(signal_annotations(updated)).status.status is SignalState.DOWNLOADING  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("{not json", "not JSON"),
        (json.dumps({"planId": "x"}), "created"),
        (json.dumps(request(command={"k0supdate": {"url": "https://x", "version": "latest"}})),
         "not a k0s version"),
        (json.dumps(request(command={"k0supdate": {"url": "javascript:alert(1)",
                                                    "version": "v1.2.3"}})), "scheme"),
        (json.dumps(request(command={"k0supdate": {"url": "ftp://x/k0s", "version": "v1.2.3"}})),
         "scheme"),
        (json.dumps(request(command={"k0supdate": {"url": "https://x", "version": "v1.2.3",
                                                   "sha256": "abc"}})), "64 hex"),
        (json.dumps([1, 2]), "invalid"),
    ],
)
def test_malformed_signal_has_reason(raw: str, needle: str) -> None:
    with pytest.raises(InvalidSignalError, match=needle):
        parse_signal({SIGNAL_DATA_KEY: raw})


def test_unsupported_signal_version() -> None:
    with pytest.raises(InvalidSignalError, match="unsupported"):
        parse_signal({SIGNAL_VERSION_KEY: "v1", SIGNAL_DATA_KEY: json.dumps(request())})


def test_request_identity() -> None:
    a = SignalData.model_validate(request())
    b = SignalData.model_validate(request(created="2026-11-30T10:00:01Z"))
    assert not a.same_request(b)
    assert a.same_request(SignalData.model_validate(request()))


def test_terminal_states() -> None:
    assert SignalState.COMPLETED.terminal and not SignalState.COMPLETED.failed
    assert SignalState.ROLLED_BACK.failed
    assert not SignalState.APPLYING_UPDATE.terminal
