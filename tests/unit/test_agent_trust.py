"""The agent's pure trust decisions: its own record against the status on the object, and
which download URLs and redirect hops it follows (issue 29, findings 2 and 5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.agents.state import (
    Journal,
    corroborate,
    policy_problem,
    redirect_problem,
    url_problem,
)
from fleet.contract.signal import K0sUpdateCommand, SignalState, SignalStatus

T0 = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
SHA = "a" * 64


def status(state: SignalState, at: datetime = T0, **kw: object) -> SignalStatus:
    return SignalStatus(status=state, timestamp=at, **kw)


DOWNLOADING = status(SignalState.DOWNLOADING, previousversion="v1.31.3+k0s.0")
CORDONING = status(SignalState.CORDONING, T0 + timedelta(seconds=5), sha256=SHA,
                   previousversion="v1.31.3+k0s.0")
STATES = st.sampled_from(list(SignalState))
STATUSES = st.builds(status, STATES, st.datetimes(timezones=st.just(UTC)),
                     reason=st.text(max_size=20), sha256=st.none() | st.just(SHA))


def test_a_new_request_is_started() -> None:
    judged = corroborate(None, None)
    assert judged.act and judged.own is None and judged.foreign is None


@given(STATUSES)
def test_a_status_without_a_record_is_never_resumed_from(seen: SignalStatus) -> None:
    judged = corroborate(None, seen)
    assert not judged.act
    if seen.status.terminal:  # an ended request (its record cleaned up): nothing to do
        assert judged.foreign is None
    else:
        assert judged.foreign is not None and "no record" in judged.foreign


def test_own_status_and_a_landed_pending_write_are_the_agents() -> None:
    journal = Journal(current=DOWNLOADING, pending=CORDONING)
    assert corroborate(journal, DOWNLOADING).own == DOWNLOADING  # the write did not land
    landed = corroborate(journal, CORDONING)
    assert landed.own == CORDONING and landed.act and landed.foreign is None
    # the record survives the disk
    assert Journal.from_json(journal.to_json()) == journal
    assert Journal.from_json(b"{garbage") is None


@pytest.mark.parametrize("forged", [
    CORDONING.model_copy(update={"sha256": "b" * 64}),  # another digest
    DOWNLOADING.model_copy(update={"timestamp": datetime(1970, 1, 1, tzinfo=UTC)}),
    status(SignalState.RESTARTING, restarted=True),  # a later step
    status(SignalState.COMPLETED),  # a forged end
    None,  # the status removed
])
def test_a_status_the_agent_did_not_write_is_reported_and_its_record_wins(
        forged: SignalStatus | None) -> None:
    journal = Journal(current=DOWNLOADING, pending=CORDONING)
    judged = corroborate(journal, forged)
    assert judged.foreign is not None and judged.known
    assert judged.own == DOWNLOADING and judged.act


def test_an_ended_record_stays_ended_whatever_is_written() -> None:
    done = status(SignalState.FAILED_VERIFY, T0 + timedelta(minutes=5))
    judged = corroborate(Journal(current=done), status(SignalState.VERIFYING))
    assert judged.foreign is not None and not judged.act and judged.own == done


@given(STATUSES, STATUSES)
def test_the_agent_resumes_only_from_what_it_wrote(mine: SignalStatus,
                                                   seen: SignalStatus) -> None:
    judged = corroborate(Journal(current=mine), seen)
    assert judged.own == mine
    assert (judged.foreign is None) == (mine == seen)


# -- URLs and redirects ---------------------------------------------------------------------------
PREFIXES = ("https://get.k0sproject.io/",)


@pytest.mark.parametrize("url", [
    "https://get.k0sproject.io/v1/k0s\\..\\..\\evil",
    "https://get.k0sproject.io/v1/k0s%zz",
    "https://get.k0sproject.io/v1/k\u00f6s",
    "https://get.k0sproject.io/v1/k0s\"",
    "https://get.k0sproject.io/v1/k0s?x=<y>",
])
def test_urls_outside_rfc3986_are_refused(url: str) -> None:
    assert url_problem(url) is not None
    cmd = K0sUpdateCommand(url=url, version="v1.32.1+k0s.0", sha256=SHA)
    problem = policy_problem(cmd, allow_unverified=False, file_url_roots=(),
                             url_prefixes=PREFIXES)
    assert problem is not None
    assert "RFC 3986" in problem or "percent-encoding" in problem


@pytest.mark.parametrize("url", [
    "https://get.k0sproject.io/v1.32.1+k0s.0/k0s-v1.32.1+k0s.0-amd64",
    "https://get.k0sproject.io/a%2Fb/k0s?sig=abc&x=1;y=(2)",
])
def test_ordinary_urls_pass(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize(("current", "location", "needle"), [
    ("https://get.k0sproject.io/k0s", "http://get.k0sproject.io/k0s", "no downgrade"),
    ("https://get.k0sproject.io/k0s", "https://evil.example/k0s", "not under any prefix"),
    ("https://get.k0sproject.io/k0s", "https://get.k0sproject.io.evil.example/k0s",
     "not under any prefix"),
    ("https://get.k0sproject.io/k0s", "https://get.k0sproject.io/x\\y", "RFC 3986"),
    ("https://get.k0sproject.io/k0s", "https://get.k0sproject.io@evil.example/k0s",
     "user information"),
])
def test_refused_redirect_hops(current: str, location: str, needle: str) -> None:
    problem = redirect_problem(current, location, PREFIXES)
    assert problem is not None and needle in problem


def test_followed_redirect_hops() -> None:
    assert redirect_problem("https://get.k0sproject.io/a", "https://get.k0sproject.io/b",
                            PREFIXES) is None
    assert redirect_problem("http://mirror.local/a", "https://cdn.example/b", None) is None
    assert redirect_problem("http://mirror.local/a", "http://cdn.example/b", None) is None
