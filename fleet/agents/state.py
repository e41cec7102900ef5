"""Pure decisions of the node agent: no I/O, every input passed in.

"Where am I" is always derived from the agent's own record of the request (the recorded
state is the step in progress; the signal's status only mirrors it and is judged against
it, never obeyed) plus facts read from disk (digests) and from the running k0s
(version, pid). The agent's I/O layers gather those facts and act on the answers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from fleet.contract.signal import (
    CORDONED_BY_KEY,
    HAPPY_PATH,
    SIGNAL_DATA_KEY,
    SIGNAL_REJECTED_KEY,
    InvalidSignalError,
    K0sUpdateCommand,
    SignalData,
    SignalState,
    SignalStatus,
    parse_signal,
    signal_digest,
)
from fleet.contract.versions import same_version

RequestKey = tuple[str, datetime]


# -- what the signal asks ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to do for this signal (none, finished, or already rejected)."""

    why: str
    signal: SignalData | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """An unparseable signal: answer once under SIGNAL_REJECTED_KEY, keyed by its digest."""

    raw: str
    reason: str

    @property
    def digest(self) -> str:
        return signal_digest(self.raw)


@dataclass(frozen=True, slots=True)
class Work:
    """A request in progress (or not yet started): run the step its status names."""

    signal: SignalData

    @property
    def key(self) -> RequestKey:
        return self.signal.request_key


Decision = Idle | Reject | Work


def rejected_digest(annotations: Mapping[str, str]) -> str | None:
    raw = annotations.get(SIGNAL_REJECTED_KEY)
    if not raw:
        return None
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError:
        return None
    digest = data.get("digest") if isinstance(data, dict) else None
    return digest if isinstance(digest, str) else None


def classify(annotations: Mapping[str, str] | None) -> Decision:
    annotations = dict(annotations or {})
    raw = annotations.get(SIGNAL_DATA_KEY)
    if raw is None:
        return Idle("no signal")
    try:
        signal = parse_signal(annotations)
    except InvalidSignalError as e:
        if rejected_digest(annotations) == signal_digest(raw):
            return Idle(f"signal already rejected: {e}")
        return Reject(raw=raw, reason=str(e))
    assert signal is not None  # the data key is present
    if signal.status is not None and signal.status.status.terminal:
        return Idle(f"request {signal.planId} is {signal.status.status}", signal)
    return Work(signal)


def rejection_value(reject: Reject, now: datetime) -> str:
    return json.dumps({"digest": reject.digest, "reason": reject.reason,
                       "timestamp": now.isoformat()}, separators=(",", ":"))


def request_id(key: RequestKey) -> str:
    """A filesystem- and label-safe id of one request (plan ids are not trusted as names)."""
    plan, created = key
    return hashlib.sha256(f"{plan}\x00{created.isoformat()}".encode()).hexdigest()[:24]


# -- policy: requests this agent refuses before touching anything -------------------------
def url_prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot serve as an allowed download prefix, or None."""
    parts = urlsplit(prefix)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return "must be an http(s) URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry user information"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    if ".." in PurePosixPath(unquote(parts.path)).parts:
        return "must not contain '..'"
    return None


# RFC 3986 path and query characters: unreserved, sub-delims, ":", "@", "/", "?" and
# percent-encodings. Anything else (a backslash, a space, non-ASCII) is read differently
# by different parsers; such a URL is refused, never normalised.
_URI_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                       "-._~!$&'()*+,;=:@/?%")
_HEX = frozenset("0123456789abcdefABCDEF")


def url_problem(url: str) -> str | None:
    """Why an http(s) download URL is unusable as given, or None: characters outside
    RFC 3986 (``\\`` included) or a malformed percent-encoding in its path or query.
    (User information and the host are judged by :func:`url_under_prefix`.)"""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError as e:
        return f"URL {url!r} is malformed: {e}"
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return f"URL {url!r} is not an http(s) URL with a host"
    rest = parts.path + ("?" + parts.query if parts.query else "")
    bad = sorted({c for c in rest if c not in _URI_CHARS})
    if bad:
        return (f"URL {url!r} has characters outside RFC 3986 in its path or query: "
                f"{', '.join(repr(c) for c in bad)}")
    for i, c in enumerate(rest):
        if c == "%" and not (len(rest) > i + 2 and rest[i + 1] in _HEX and rest[i + 2] in _HEX):
            return f"URL {url!r} has a malformed percent-encoding"
    return None


def redirect_problem(current: str, location: str, url_prefixes: tuple[str, ...] | None
                     ) -> str | None:
    """Why a download must not follow a redirect from ``current`` to ``location`` (already
    resolved against ``current``), or None: each hop is judged like the request's URL
    (RFC 3986, under an accepted prefix when ``url_prefixes`` is given), and never from
    https to http."""
    problem = url_problem(location)
    if problem:
        return f"redirect to a refused URL: {problem}"
    if urlsplit(location).username is not None or urlsplit(location).password is not None:
        return f"redirect to {location!r}, a URL with user information"
    if urlsplit(current).scheme.lower() == "https" and \
            urlsplit(location).scheme.lower() != "https":
        return f"redirect from https to {location!r} (no downgrade to http)"
    if url_prefixes is not None and not any(url_under_prefix(location, p)
                                            for p in url_prefixes):
        return (f"redirect to {location!r}, not under any prefix this agent accepts "
                f"({', '.join(url_prefixes) or 'none'})")
    return None


def _origin(parts: SplitResult) -> tuple[str, str, int]:
    scheme = parts.scheme.lower()
    return (scheme, (parts.hostname or "").lower(),
            parts.port or (443 if scheme == "https" else 80))


def url_under_prefix(url: str, prefix: str) -> bool:
    """Whether ``url`` lies under ``prefix``: same scheme, host and port, and a path at or
    below the prefix's path (on a segment boundary, percent-decoded, no ``..``), without
    user information (``https://good.example@evil.example/`` is evil.example)."""
    try:
        u, p = urlsplit(url), urlsplit(prefix)
        if u.username is not None or u.password is not None or _origin(u) != _origin(p):
            return False
    except ValueError:  # e.g. a port out of range
        return False
    path, base = unquote(u.path) or "/", unquote(p.path) or "/"
    if ".." in PurePosixPath(path).parts:
        return False
    if base.endswith("/"):
        return path.startswith(base)
    return path == base or path.startswith(base + "/")


def policy_problem(cmd: K0sUpdateCommand, *, allow_unverified: bool,
                   file_url_roots: tuple[str, ...],
                   url_prefixes: tuple[str, ...] = ()) -> str | None:
    """Why this agent refuses the request (InvalidRequest), or None.

    The signal model already rejects structurally bad requests; this is the agent's own
    policy: a binary it will run as root must come from where the agent was installed to
    accept releases from (``url_prefixes``), and be verified unless both the request and
    the agent's configuration say otherwise, and a file: URL may only read below the
    directories the agent was told to trust (anyone able to annotate a Node could
    otherwise have it install /etc/shadow, or a file an unprivileged user dropped in
    /tmp, as the k0s binary).
    """
    if cmd.sha256 is None:
        if not cmd.allowunverified:
            return "request has no sha256 and does not allow an unverified download"
        if not allow_unverified:
            return ("request allows an unverified download but this agent refuses "
                    "unverified binaries (enable --allow-unverified to permit)")
    parts = urlsplit(cmd.url)
    if parts.scheme.lower() == "file":
        path = PurePosixPath(unquote(parts.path))
        if ".." in path.parts:
            return f"file URL {cmd.url!r} contains '..'"
        if not any(_under(path, PurePosixPath(root)) for root in file_url_roots):
            return (f"file URL {cmd.url!r} is outside the directories this agent may read "
                    f"({', '.join(file_url_roots) or 'none configured: --file-url-root'})")
        return None
    problem = url_problem(cmd.url)
    if problem:
        return problem
    if not any(url_under_prefix(cmd.url, prefix) for prefix in url_prefixes):
        return (f"download URL {cmd.url!r} is not under any prefix this agent accepts "
                f"({', '.join(url_prefixes) or 'none configured: --allowed-url-prefix'})")
    return None


def _under(path: PurePosixPath, root: PurePosixPath) -> bool:
    return path == root or root in path.parents


# -- the agent's own record of a request (its status is data, not orders) ------------------
@dataclass(frozen=True, slots=True)
class Journal:
    """What this agent itself recorded for one request, durably, in its state directory:
    the last status of its own that landed (``current``) and the one it is about to write
    (``pending``: written before the API write, so a crash between the two is recognised).

    The status member on the object is only a report: anyone allowed to patch the Node
    could write it. Where the agent is, which digest it installs, when a step's deadline
    started and from which version it rolls back come from here."""

    current: SignalStatus | None = None
    pending: SignalStatus | None = None

    def to_json(self) -> bytes:
        return json.dumps({
            "current": _dump(self.current), "pending": _dump(self.pending)}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Journal | None:
        """None when unreadable (no record: nothing is resumed from it)."""
        try:
            raw: Any = json.loads(data)
            return cls(current=_load(raw["current"]), pending=_load(raw["pending"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def _dump(status: SignalStatus | None) -> dict[str, Any] | None:
    return None if status is None else status.model_dump(mode="json")


def _load(raw: Any) -> SignalStatus | None:
    return None if raw is None else SignalStatus.model_validate(raw)


def same_status(a: SignalStatus | None, b: SignalStatus | None) -> bool:
    """Field for field (as JSON): a status is ours only if nothing of it was changed."""
    return _dump(a) == _dump(b)


@dataclass(frozen=True, slots=True)
class Corroborated:
    """Where the agent stands on a request, from its own record, given the status seen."""

    own: SignalStatus | None  # the status the agent resumes from (None: not started)
    act: bool  # drive the request (resume ``own``)
    # why the status on the object is not one this agent wrote (to report), else None
    foreign: str | None = None
    known: bool = False  # the agent has a record of this request


def corroborate(journal: Journal | None, seen: SignalStatus | None) -> Corroborated:
    """Judge the status on the object against the agent's own record of the request.

    - No record: a request without status is new (start it); a terminal status is an
      ended request whose record was cleaned up (or an older agent's: nothing to do);
      any other status is not this agent's: ignored, reported, never resumed from.
    - A record: the status on the object must be the one the agent last wrote or the one
      it was writing when it stopped (then that write landed). Anything else is someone
      else's: reported, and the agent goes on from its own record.
    """
    if journal is None:
        if seen is None:
            return Corroborated(own=None, act=True)
        if seen.status.terminal:
            return Corroborated(own=seen, act=False)
        return Corroborated(own=None, act=False, foreign=(
            f"status {seen.status} is on a request this agent has no record of"))
    known = journal.current
    if journal.pending is not None and same_status(seen, journal.pending):
        known = journal.pending
    elif not same_status(seen, journal.current):
        what = f"status {seen.status} of {seen.timestamp.isoformat()}" if seen is not None \
            else "no status"
        mine = journal.current.status if journal.current is not None else "not started"
        return Corroborated(own=journal.current, known=True,
                            act=journal.current is None or not journal.current.status.terminal,
                            foreign=f"{what} is not what this agent wrote (its record: {mine})")
    return Corroborated(own=known, known=True,
                        act=known is None or not known.status.terminal)


# -- the walk -----------------------------------------------------------------------------
def successor(state: SignalState) -> SignalState:
    """The next state on the happy path."""
    i = HAPPY_PATH.index(state)
    if i + 1 >= len(HAPPY_PATH):
        raise ValueError(f"{state} has no successor")
    return HAPPY_PATH[i + 1]


def first_status(cmd: K0sUpdateCommand, running_version: str | None, now: datetime) -> SignalStatus:
    """The first status of a request: straight to Completed when already there."""
    if not cmd.forceupdate and same_version(running_version, cmd.version):
        return SignalStatus(status=SignalState.COMPLETED, timestamp=now,
                            reason=f"already running {cmd.version}",
                            previousversion=running_version)
    return SignalStatus(status=SignalState.DOWNLOADING, timestamp=now,
                        previousversion=running_version)


def next_status(prev: SignalStatus, state: SignalState, now: datetime, *, reason: str = "",
                **changes: Any) -> SignalStatus:
    """A new status carrying forward what later steps need (previous version, digest)."""
    return prev.model_copy(update={"status": state, "timestamp": now, "reason": reason,
                                   **changes})


# -- apply: what the disk says --------------------------------------------------------
class ApplyAction(StrEnum):
    ALREADY_APPLIED = "already-applied"
    INSTALL = "install"
    NEED_STAGED = "need-staged"


def apply_action(*, installed: str | None, staged: str | None, expected: str) -> ApplyAction:
    """Decide the apply step from digests alone (k0s PR 7706's rule; docs/agent.md, ApplyingUpdate).

    The installed binary already having the requested digest means a previous run got
    past the rename (whatever happened to the staged file or the status write), so the
    rollback copy must not be touched again.
    """
    if installed == expected:
        return ApplyAction.ALREADY_APPLIED
    if staged == expected:
        return ApplyAction.INSTALL
    return ApplyAction.NEED_STAGED


# -- restart: once per request ------------------------------------------------------------
class RestartAction(StrEnum):
    ISSUE = "issue"  # no record of a restart for this request: record intent, then restart
    DONE = "done"  # a restart was issued and the process it targeted is gone
    WAIT_THEN_REISSUE = "wait-then-reissue"  # issued, but the same process still runs


@dataclass(frozen=True, slots=True)
class RestartMarker:
    """Written (fsync'd) before a restart is issued; survives the agent."""

    request: str
    pid: int | None  # the k0s process the restart was meant to replace, if known

    def to_json(self) -> bytes:
        return json.dumps({"request": self.request, "pid": self.pid}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RestartMarker | None:
        try:
            raw: Any = json.loads(data)
            pid = raw.get("pid")
            return cls(request=str(raw["request"]), pid=int(pid) if pid is not None else None)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def restart_action(marker: RestartMarker | None, current_pid: int | None) -> RestartAction:
    """Exactly-once restart, decided from the intent marker and the live process.

    The marker is durable before the restart is issued, so "no marker" proves no restart
    was issued for this request. With a marker, the restart may or may not have been
    issued (the agent can die between writing the marker and acting). The process tells:
    if the pid recorded in the marker no longer runs, or k0s is down, the restart
    happened (or the init system is doing it) and must not be repeated. If the very same
    process still runs, either the restart was never issued or the process is still
    shutting down; the caller waits a grace period for it to go, and only then issues
    the restart again. Repeating a restart aimed at the same process cannot produce a
    second start. Without a known pid, the marker alone decides (at most once).
    """
    if marker is None:
        return RestartAction.ISSUE
    if marker.pid is None or current_pid is None or current_pid != marker.pid:
        return RestartAction.DONE
    return RestartAction.WAIT_THEN_REISSUE


# -- cordon --------------------------------------------------------------------------------
CORDON_HELD_STATES = frozenset({
    SignalState.CORDONING,
    SignalState.APPLYING_UPDATE,
    SignalState.RESTARTING,
    SignalState.VERIFYING,
    # a node whose upgrade and rollback both failed stays cordoned for a human
    SignalState.FAILED_VERIFY,
})


def holds_cordon(state: SignalState | None) -> bool:
    return state in CORDON_HELD_STATES


def cordoned_by_agent(node: Mapping[str, Any]) -> bool:
    ann = (node.get("metadata") or {}).get("annotations") or {}
    return CORDONED_BY_KEY in ann


def cordon_patch(node: Mapping[str, Any], owner: str) -> dict[str, Any] | None:
    """Cordon, marking it as ours; None when already cordoned (by us or by someone else).

    A node someone else cordoned is left without our mark, so we never uncordon it.
    """
    if cordoned_by_agent(node) or (node.get("spec") or {}).get("unschedulable"):
        return None
    return {"spec": {"unschedulable": True},
            "metadata": {"annotations": {CORDONED_BY_KEY: owner}}}


def uncordon_patch(node: Mapping[str, Any]) -> dict[str, Any] | None:
    if not cordoned_by_agent(node):
        return None
    return {"spec": {"unschedulable": None},
            "metadata": {"annotations": {CORDONED_BY_KEY: None}}}


# -- drain ---------------------------------------------------------------------------------
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


def eviction_exempt(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is not evicted (DaemonSet pods come back anyway; mirror pods are static)."""
    meta = pod.get("metadata") or {}
    if MIRROR_POD_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror pod"
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet" and ref.get("controller"):
            return "DaemonSet pod"
    return None


def node_ready(node: Mapping[str, Any] | None) -> bool:
    if node is None:
        return False
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False
