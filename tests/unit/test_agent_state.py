"""Pure decisions of the node agent."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.agents.state import (
    ApplyAction,
    Idle,
    Reject,
    RestartAction,
    RestartMarker,
    Work,
    apply_action,
    classify,
    cordon_patch,
    eviction_exempt,
    first_status,
    holds_cordon,
    next_status,
    node_ready,
    policy_problem,
    rejection_value,
    request_id,
    restart_action,
    successor,
    uncordon_patch,
    url_prefix_problem,
)
from fleet.contract.signal import (
    CORDONED_BY_KEY,
    HAPPY_PATH,
    SIGNAL_DATA_KEY,
    SIGNAL_REJECTED_KEY,
    K0sUpdateCommand,
    SignalState,
    SignalStatus,
    replace_status,
)

SHA = "c" * 64
NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def raw(**over: object) -> str:
    update = {"url": "https://r.example/k0s", "version": "v1.32.1", "sha256": SHA}
    update.update(over)  # type: ignore[arg-type]
    return json.dumps({"planId": "p", "created": "2026-11-30T10:00:00Z",
                       "command": {"id": 1, "k0supdate": update}})


def cmd(**over: object) -> K0sUpdateCommand:
    base: dict[str, object] = {"url": "https://r.example/k0s", "version": "v1.32.1",
                               "sha256": SHA}
    base.update(over)
    return K0sUpdateCommand.model_validate(base)


# -- classify -------------------------------------------------------------------------------
def test_no_signal_is_idle() -> None:
    assert isinstance(classify({}), Idle)
    assert isinstance(classify(None), Idle)


def test_new_and_in_progress_requests_are_work() -> None:
    d = classify({SIGNAL_DATA_KEY: raw()})
    assert isinstance(d, Work) and d.signal.status is None
    mid = replace_status(raw(), SignalStatus(status=SignalState.RESTARTING, timestamp=NOW))
    d2 = classify({SIGNAL_DATA_KEY: mid})
    assert isinstance(d2, Work) and d2.key == d.key


@pytest.mark.parametrize("state", sorted(s for s in SignalState if s.terminal))
def test_terminal_requests_are_idle(state: SignalState) -> None:
    done = replace_status(raw(), SignalStatus(status=state, timestamp=NOW))
    d = classify({SIGNAL_DATA_KEY: done})
    assert isinstance(d, Idle) and d.signal is not None


def test_malformed_signal_is_rejected_once() -> None:
    bad = "{not json"
    d = classify({SIGNAL_DATA_KEY: bad})
    assert isinstance(d, Reject) and "not JSON" in d.reason
    answered = {SIGNAL_DATA_KEY: bad, SIGNAL_REJECTED_KEY: rejection_value(d, NOW)}
    assert isinstance(classify(answered), Idle)
    # a corrected (different) value is looked at again
    fixed = {SIGNAL_DATA_KEY: "{still not json", SIGNAL_REJECTED_KEY: rejection_value(d, NOW)}
    assert isinstance(classify(fixed), Reject)


@pytest.mark.parametrize("garbage", ["", "[]", "null", '"x"', "{}", "{\"planId\": 1}"])
def test_rejection_annotation_garbage_does_not_crash(garbage: str) -> None:
    d = classify({SIGNAL_DATA_KEY: "{bad", SIGNAL_REJECTED_KEY: garbage})
    assert isinstance(d, Reject)


@given(st.text(max_size=200))
def test_classify_never_raises(value: str) -> None:
    assert isinstance(classify({SIGNAL_DATA_KEY: value}), Idle | Reject | Work)


def test_request_id_is_filename_safe_and_distinct() -> None:
    a = request_id(("../../etc/passwd", NOW))
    b = request_id(("../../etc/passwd", NOW.replace(second=1)))
    assert a != b and a.isalnum() and len(a) == 24


# -- policy ----------------------------------------------------------------------------------
def test_digest_required_unless_both_sides_allow() -> None:
    assert "no sha256" in (policy_problem(cmd(sha256=None), allow_unverified=True,
                                          file_url_roots=()) or "")
    assert "refuses unverified" in (policy_problem(cmd(sha256=None, allowunverified=True),
                                                   allow_unverified=False,
                                                   file_url_roots=()) or "")
    assert policy_problem(cmd(sha256=None, allowunverified=True), allow_unverified=True,
                          file_url_roots=(), url_prefixes=("https://r.example/",)) is None


PREFIX = "https://releases.example/k0s/"


@pytest.mark.parametrize(("url", "ok"), [
    ("https://releases.example/k0s/v1.32.1/k0s-amd64", True),
    ("https://RELEASES.example:443/k0s/v1.32.1/k0s?arch=amd64", True),
    ("https://releases.example/k0s", False),  # the prefix ends with a slash
    ("https://releases.example/k0s-evil/k0s", False),
    ("https://releases.example/k0s/../evil/k0s", False),
    ("https://releases.example/k0s/%2e%2e/evil/k0s", False),
    ("https://releases.example/other/k0s", False),
    ("http://releases.example/k0s/v1/k0s", False),  # another scheme
    ("https://releases.example:8443/k0s/v1/k0s", False),  # another port
    ("https://releases.example.evil.example/k0s/v1/k0s", False),
    ("https://releases.example@evil.example/k0s/v1/k0s", False),
    ("https://user@releases.example/k0s/v1/k0s", False),
    ("https://evil.example/k0s/v1/k0s", False),
])
def test_http_urls_only_under_allowed_prefixes(url: str, ok: bool) -> None:
    problem = policy_problem(cmd(url=url), allow_unverified=False, file_url_roots=(),
                             url_prefixes=("https://other.example/", PREFIX))
    assert (problem is None) is ok, problem
    if not ok:
        assert problem is not None and PREFIX in problem


def test_a_prefix_without_trailing_slash_ends_at_a_segment() -> None:
    prefixes = ("https://r.example/k0s",)
    ok = policy_problem(cmd(url="https://r.example/k0s/v1"), allow_unverified=False,
                        file_url_roots=(), url_prefixes=prefixes)
    evil = policy_problem(cmd(url="https://r.example/k0s-evil"), allow_unverified=False,
                          file_url_roots=(), url_prefixes=prefixes)
    assert ok is None and evil is not None


def test_no_prefixes_refuses_every_http_url() -> None:
    problem = policy_problem(cmd(url="https://r.example/k0s"), allow_unverified=False,
                             file_url_roots=())
    assert problem is not None and "--allowed-url-prefix" in problem


@pytest.mark.parametrize("prefix", ["ftp://r.example/", "https:///k0s/", "https://u@r.example/",
                                    "https://r.example/?a=1", "https://r.example/a/../b/"])
def test_unusable_prefixes_are_named(prefix: str) -> None:
    assert url_prefix_problem(prefix) is not None


@pytest.mark.parametrize(("url", "ok"), [
    ("file:///srv/releases/k0s-v1.32.1", True),
    ("file:///srv/releases", True),
    ("file:///etc/shadow", False),
    ("file:///srv/releases/../../etc/shadow", False),
    ("file:///srv/releases-evil/k0s", False),
    ("file:///srv/rel%65ases/k0s", True),  # percent-decoded before the check
    ("file:///srv/releases/%2e%2e/%2e%2e/etc/shadow", False),
])
def test_file_urls_only_below_trusted_roots(url: str, ok: bool) -> None:
    problem = policy_problem(cmd(url=url), allow_unverified=False,
                             file_url_roots=("/srv/releases",))
    assert (problem is None) is ok, problem


def test_file_urls_refused_without_roots() -> None:
    problem = policy_problem(cmd(url="file:///srv/releases/k0s"), allow_unverified=False,
                             file_url_roots=())
    assert problem is not None and "--file-url-root" in problem


# -- the walk --------------------------------------------------------------------------------
def test_successor_walks_the_happy_path() -> None:
    walked = [HAPPY_PATH[0]]
    while walked[-1] is not SignalState.COMPLETED:
        walked.append(successor(walked[-1]))
    assert tuple(walked) == HAPPY_PATH
    with pytest.raises(ValueError):
        successor(SignalState.COMPLETED)


def test_first_status() -> None:
    done = first_status(cmd(), "v1.32.1+k0s.0", NOW)
    assert done.status is SignalState.COMPLETED and "already running" in done.reason
    assert first_status(cmd(), "v1.32.1-k0s.0", NOW).status is SignalState.COMPLETED
    forced = first_status(cmd(forceupdate=True), "v1.32.1+k0s.0", NOW)
    assert forced.status is SignalState.DOWNLOADING
    fresh = first_status(cmd(), "v1.31.3+k0s.0", NOW)
    assert fresh.status is SignalState.DOWNLOADING and fresh.previousversion == "v1.31.3+k0s.0"
    assert first_status(cmd(), None, NOW).status is SignalState.DOWNLOADING


def test_next_status_carries_forward() -> None:
    s = SignalStatus(status=SignalState.DOWNLOADING, timestamp=NOW, previousversion="v1",
                     reason="x")
    n = next_status(s, SignalState.CORDONING, NOW, sha256=SHA)
    assert (n.previousversion, n.sha256, n.reason) == ("v1", SHA, "")
    n2 = next_status(n, SignalState.VERIFYING, NOW, restarted=True)
    assert n2.sha256 == SHA and n2.restarted


# -- apply -----------------------------------------------------------------------------------
digests = st.one_of(st.none(), st.sampled_from(["a" * 64, "b" * 64, "c" * 64]))


@given(installed=digests, staged=digests)
def test_apply_action(installed: str | None, staged: str | None) -> None:
    expected = "c" * 64
    action = apply_action(installed=installed, staged=staged, expected=expected)
    if installed == expected:
        assert action is ApplyAction.ALREADY_APPLIED  # the 7703 case: never re-apply
    elif staged == expected:
        assert action is ApplyAction.INSTALL
    else:
        assert action is ApplyAction.NEED_STAGED


# -- restart ---------------------------------------------------------------------------------
pids = st.one_of(st.none(), st.integers(1, 5))


@given(marker_pid=pids, current=pids, has_marker=st.booleans())
def test_restart_action(marker_pid: int | None, current: int | None, has_marker: bool) -> None:
    marker = RestartMarker("r", marker_pid) if has_marker else None
    action = restart_action(marker, current)
    if marker is None:
        assert action is RestartAction.ISSUE
    elif marker_pid is not None and current == marker_pid:
        # the process the restart was aimed at still runs: maybe never issued
        assert action is RestartAction.WAIT_THEN_REISSUE
    else:
        assert action is RestartAction.DONE


def test_marker_roundtrip_and_garbage() -> None:
    m = RestartMarker("abc", 42)
    assert RestartMarker.from_json(m.to_json()) == m
    assert RestartMarker.from_json(RestartMarker("abc", None).to_json()) == \
        RestartMarker("abc", None)
    for junk in (b"", b"{", b"[]", b'{"pid": 1}', b'{"request": "x", "pid": "nan"}'):
        assert RestartMarker.from_json(junk) is None


# -- cordon and drain ------------------------------------------------------------------------
def test_cordon_only_what_is_not_cordoned() -> None:
    node: dict[str, object] = {"metadata": {"name": "n"}, "spec": {}}
    p = cordon_patch(node, "me")
    assert p == {"spec": {"unschedulable": True},
                 "metadata": {"annotations": {CORDONED_BY_KEY: "me"}}}
    theirs = {"metadata": {"name": "n"}, "spec": {"unschedulable": True}}
    assert cordon_patch(theirs, "me") is None
    assert uncordon_patch(theirs) is None  # never undo someone else's cordon
    ours = {"metadata": {"name": "n", "annotations": {CORDONED_BY_KEY: "me"}},
            "spec": {"unschedulable": True}}
    assert cordon_patch(ours, "me") is None
    assert uncordon_patch(ours) == {"spec": {"unschedulable": None},
                                    "metadata": {"annotations": {CORDONED_BY_KEY: None}}}


def test_cordon_held_only_mid_upgrade_or_after_a_failed_rollback() -> None:
    held = {s for s in SignalState if holds_cordon(s)}
    assert held == {SignalState.CORDONING, SignalState.APPLYING_UPDATE,
                    SignalState.RESTARTING, SignalState.VERIFYING, SignalState.FAILED_VERIFY}
    assert not holds_cordon(None)


def test_eviction_exemptions() -> None:
    ds = {"metadata": {"ownerReferences": [{"kind": "DaemonSet", "controller": True}]}}
    mirror = {"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}
    rs = {"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "controller": True}]}}
    assert eviction_exempt(ds) == "DaemonSet pod"
    assert eviction_exempt(mirror) == "mirror pod"
    assert eviction_exempt(rs) is None
    assert eviction_exempt({}) is None


def test_node_ready() -> None:
    assert not node_ready(None)
    assert not node_ready({"status": {}})
    assert node_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not node_ready({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
