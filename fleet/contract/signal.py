"""The node signal: how the controller asks a node to upgrade, and how the node answers.

The signal lives in annotations on the workload cluster's Node (or, for a pure k0s
controller without a Node, its autopilot ControlNode). It uses the JSON shape of k0s
autopilot's signal v2 but under k0s-fleet's own keys, so autopilot never reacts to it.
This module is shared by the controller (writer of requests) and the agent (writer
of status); validation lives here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleet.contract.versions import InvalidVersionError, K0sVersion

DOMAIN = "fleet.k0s-fleet.io"
SIGNAL_VERSION_KEY = f"{DOMAIN}/signal-version"
SIGNAL_DATA_KEY = f"{DOMAIN}/signal-data"
SIGNAL_VERSION = "v2"
# Set by the agent on a Node it cordoned, so it uncordons only what it cordoned.
CORDONED_BY_KEY = f"{DOMAIN}/cordoned-by"
# The running k0s version as last reported by the agent.
RUNNING_VERSION_KEY = f"{DOMAIN}/k0s-version"
# The agent's answer to a signal it cannot parse (so it has no status to write into):
# JSON {"digest": signal_digest(raw value), "reason": ..., "timestamp": ...}. The digest
# makes the rejection apply to exactly that value: a corrected signal is acted upon.
SIGNAL_REJECTED_KEY = f"{DOMAIN}/signal-rejected"

# Autopilot's own keys, for the `autopilot` executor.
AUTOPILOT_SIGNAL_VERSION_KEY = "k0sproject.io/autopilot-signal-version"
AUTOPILOT_SIGNAL_DATA_KEY = "k0sproject.io/autopilot-signal-data"

ALLOWED_URL_SCHEMES = frozenset({"http", "https", "file"})


class SignalState(StrEnum):
    DOWNLOADING = "Downloading"
    CORDONING = "Cordoning"
    APPLYING_UPDATE = "ApplyingUpdate"
    RESTARTING = "Restarting"
    VERIFYING = "Verifying"
    UNCORDONING = "UnCordoning"
    COMPLETED = "Completed"
    FAILED_DOWNLOAD = "FailedDownload"
    FAILED_DRAIN = "FailedDrain"
    FAILED_VERIFY = "FailedVerify"
    # The new binary could not be put in place (read-only fs, permissions); the installed
    # binary is untouched.
    FAILED_APPLY = "FailedApply"
    ROLLED_BACK = "RolledBack"
    # The request itself could not be understood; nothing was touched.
    INVALID_REQUEST = "InvalidRequest"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def failed(self) -> bool:
        return self in FAILED_STATES


FAILED_STATES = frozenset(
    {
        SignalState.FAILED_DOWNLOAD,
        SignalState.FAILED_DRAIN,
        SignalState.FAILED_VERIFY,
        SignalState.FAILED_APPLY,
        SignalState.ROLLED_BACK,
        SignalState.INVALID_REQUEST,
    }
)
TERMINAL_STATES = FAILED_STATES | {SignalState.COMPLETED}

# The order in which an upgrade walks; the agent resumes from the recorded state.
HAPPY_PATH = (
    SignalState.DOWNLOADING,
    SignalState.CORDONING,
    SignalState.APPLYING_UPDATE,
    SignalState.RESTARTING,
    SignalState.VERIFYING,
    SignalState.UNCORDONING,
    SignalState.COMPLETED,
)


def utcnow() -> datetime:
    return datetime.now(UTC)


# Upper bound for a request's drain/verify timeout (30 days, the fleet config's own range):
# far beyond any sane value, it keeps garbage (milliseconds for seconds, 1e300) out.
MAX_POLICY_SECONDS = 30 * 86400.0


class DrainTimeoutAction(StrEnum):
    """What an agent does when its drain timeout passes (fleet config, agent flag, signal)."""

    FAIL = "fail"  # give up on the node (FailedDrain), uncordon it, count a failure
    PROCEED = "proceed"  # upgrade anyway once the drain timeout has passed


# The node policy's settings, one name each, in two processes: the fleet config's
# ``agent:`` keys on the controller (K0S_FLEET_AGENT__<KEY>, sent with each request as a
# NodePolicy) and the agent's own defaults for them (K0S_FLEET_AGENT_<KEY>, --<key>).
AGENT_ENV_PREFIX = "K0S_FLEET_AGENT_"
POLICY_SETTINGS = {"drain_timeout": "drainTimeout", "drain_timeout_action": "drainTimeoutAction",
                   "verify_timeout": "verifyTimeout",
                   "delete_empty_dir_data": "deleteEmptyDirData", "force": "force"}


def misplaced_policy_variable(var: str, *, on_agent: bool) -> str | None:
    """What is wrong with ``var`` when it sets a node-policy setting in the other
    process's spelling (on the agent the controller's ``K0S_FLEET_AGENT__<KEY>``, on the
    controller the agent's ``K0S_FLEET_AGENT_<KEY>``), naming both variables; else None.
    Keys match in any case, with or without underscores."""
    upper = var.upper()
    if not upper.startswith(AGENT_ENV_PREFIX):
        return None
    rest = upper[len(AGENT_ENV_PREFIX):]
    if rest.startswith("_") != on_agent:
        return None
    letters = rest.replace("_", "").lower()
    for setting, key in POLICY_SETTINGS.items():
        if letters == setting.replace("_", ""):
            agents, controllers = AGENT_ENV_PREFIX + setting.upper(), \
                AGENT_ENV_PREFIX + "_" + setting.upper()
            if on_agent:
                return (f"sets the fleet config's agent.{key} on the controller, not this "
                        f"agent; the agent's own setting is {agents}")
            return (f"is the agent's own setting (k0s-fleet agent); the fleet config's "
                    f"agent.{key} is set with {controllers}")
    return None


class DrainBehavior(StrEnum):
    """What a drain does with the pods a rule selects (Cluster API's MachineDrainRule)."""

    DRAIN = "Drain"  # evicted, in groups by increasing order
    SKIP = "Skip"  # left running
    WAIT_COMPLETED = "WaitCompleted"  # never evicted; the drain waits until they end


# The most drain rules one request carries (Cluster API caps a rule's selectors at 32).
MAX_DRAIN_RULES = 64
INT32 = 2**31


class DrainRulePods(BaseModel):
    """Which pods a drain rule applies to: those matching ``selector`` (empty: every pod)
    in namespaces matching ``namespaceSelector`` (empty: every namespace)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    selector: dict[str, Any] | None = None
    namespaceSelector: dict[str, Any] | None = None

    @field_validator("selector", "namespaceSelector")
    @classmethod
    def _selector(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        problem = None if v is None else _label_selector_problem(v)
        if problem is not None:
            raise ValueError(f"not a label selector: {problem}")
        return v


class DrainRule(BaseModel):
    """One Cluster API MachineDrainRule that applies to the request's Machine, as the
    controller resolved it (the Machine and Cluster selectors already matched): its name
    (rules are tried in name order, the first whose pods match decides), what it does
    and which pods it applies to (none listed: every pod)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(min_length=1, max_length=253)
    behavior: DrainBehavior
    order: int = Field(0, ge=-INT32, lt=INT32, strict=True)
    pods: tuple[DrainRulePods, ...] = ()

    @field_validator("order")
    @classmethod
    def _order(cls, v: int, info: Any) -> int:
        if v and info.data.get("behavior") not in (None, DrainBehavior.DRAIN):
            raise ValueError("order can only be set with behavior Drain")
        return v


class NodePolicy(BaseModel):
    """Per-request node policy (the fleet config's ``agent:`` section).

    When a request carries it, it overrides the agent's own settings for that request
    only; without it the agent uses its own flags/environment. Agents that predate it
    ignore it (extra="ignore"), and an absent field inside it means the agent's own value.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    drainTimeoutSeconds: float | None = Field(
        None, gt=0, le=MAX_POLICY_SECONDS, strict=True, allow_inf_nan=False)
    drainTimeoutAction: DrainTimeoutAction | None = None
    verifyTimeoutSeconds: float | None = Field(
        None, gt=0, le=MAX_POLICY_SECONDS, strict=True, allow_inf_nan=False)
    # Drain: evict pods with emptyDir volumes (their data is lost) / pods without a
    # controller (nothing recreates them); unset or false = refuse the drain, naming them.
    deleteEmptyDirData: bool | None = Field(None, strict=True)
    force: bool | None = Field(None, strict=True)
    # Drain: pods matching any of these label selectors (metav1.LabelSelector, camelCase)
    # are left running, like the cluster.x-k8s.io/drain: skip label (older controllers'
    # form of a Skip rule; drainRules says more).
    skipPods: tuple[dict[str, Any], ...] | None = None
    # Drain: Cluster API MachineDrainRules that apply to this Machine, in name order
    # (pod labels cluster.x-k8s.io/drain: skip | wait-completed come first, as in CAPI).
    drainRules: tuple[DrainRule, ...] | None = Field(None, max_length=MAX_DRAIN_RULES)

    @field_validator("drainRules")
    @classmethod
    def _rules_in_name_order(cls, v: tuple[DrainRule, ...] | None
                             ) -> tuple[DrainRule, ...] | None:
        names = [r.name for r in v or ()]
        if names != sorted(names) or len(set(names)) != len(names):
            raise ValueError("drain rules must be unique and in name order")
        return v

    @field_validator("skipPods")
    @classmethod
    def _selectors(cls, v: tuple[dict[str, Any], ...] | None
                   ) -> tuple[dict[str, Any], ...] | None:
        # The shape of a metav1.LabelSelector, checked here without fleet.contract.selectors (the
        # wire contract stays below the configuration layer; the agent matches with it).
        for i, sel in enumerate(v or ()):
            problem = _label_selector_problem(sel)
            if problem is not None:
                raise ValueError(f"skipPods[{i}] is not a label selector: {problem}")
        return v


_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist"}


def _label_selector_problem(sel: object) -> str | None:
    """Why ``sel`` is not a metav1.LabelSelector (camelCase), or None."""
    if not isinstance(sel, dict):
        return "not an object"
    unknown = set(sel) - {"matchLabels", "matchExpressions"}
    if unknown:
        return f"unknown field {sorted(unknown)[0]!r}"
    labels = sel.get("matchLabels") or {}
    if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(x, str) for k, x in labels.items()):
        return "matchLabels must map strings to strings"
    exprs = sel.get("matchExpressions") or []
    if not isinstance(exprs, list):
        return "matchExpressions must be a list"
    for j, e in enumerate(exprs):
        if not isinstance(e, dict) or not isinstance(e.get("key"), str):
            return f"matchExpressions[{j}] needs a key"
        op, values = e.get("operator"), e.get("values") or []
        if op not in _OPERATORS:
            return f"matchExpressions[{j}].operator {op!r} is not one of {sorted(_OPERATORS)}"
        if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
            return f"matchExpressions[{j}].values must be strings"
        if (op in ("In", "NotIn")) != bool(values):
            return (f"matchExpressions[{j}]: {op} " + ("needs values" if op in ("In", "NotIn")
                                                       else "takes no values"))
    return None


class K0sUpdateCommand(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    url: str
    version: str
    sha256: str | None = None
    forceupdate: bool = False
    # Explicit opt-in to install a binary without a digest (fleet download policy).
    allowunverified: bool = False
    # executor "agent" only: the fleet's node policy for this request (see NodePolicy).
    policy: NodePolicy | None = None

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        try:
            return str(K0sVersion.parse(v))
        except InvalidVersionError as e:
            raise ValueError(str(e)) from None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 (raises on a malformed port)
        except ValueError as e:
            raise ValueError(f"malformed URL: {e}") from None
        scheme = parts.scheme.lower()
        if scheme not in ALLOWED_URL_SCHEMES:
            raise ValueError(
                f"URL scheme {scheme or '(none)'!r} not allowed; use one of "
                f"{', '.join(sorted(ALLOWED_URL_SCHEMES))}"
            )
        if any(c.isspace() or ord(c) < 0x20 for c in v):
            raise ValueError("URL contains whitespace or control characters")
        if scheme in ("http", "https") and not parts.hostname:
            raise ValueError(f"{scheme} URL has no host")
        if scheme == "file":
            # Only a local absolute path; which directories an agent may read is its policy.
            if parts.netloc not in ("", "localhost"):
                raise ValueError("file URL must not name a host")
            if not parts.path.startswith("/"):
                raise ValueError("file URL must hold an absolute path")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        v = v.lower().removeprefix("sha256:")
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError("sha256 must be 64 hex characters")
        return v


class SignalCommand(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: int = 0
    k0supdate: K0sUpdateCommand


# The most per-pod drain outcomes a status names (the annotation stays small).
MAX_DRAIN_OUTCOMES = 50
MORE_PODS = "..."


class SignalStatus(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    status: SignalState
    timestamp: datetime = Field(default_factory=utcnow)
    reason: str = ""
    # Set once the restart for this request was issued; makes the restart happen once.
    restarted: bool = False
    # Version that was running before the upgrade (for rollback and reporting).
    previousversion: str | None = None
    # sha256 of the binary being installed, as downloaded (the request's digest, or the
    # computed one when the request allowed an unverified download).
    sha256: str | None = None
    # What the drain did with each pod, one "<namespace>/<pod>: <outcome>" each (evicted,
    # left running: why, waited for until completed: why, still on the node), at most
    # MAX_DRAIN_OUTCOMES and a count of the rest; carried through the request's later
    # steps. A list of strings: the status stays a flat object (see _status_member).
    drain: tuple[str, ...] | None = Field(None, max_length=MAX_DRAIN_OUTCOMES + 1)


def drain_outcomes(outcomes: dict[str, str]) -> tuple[str, ...]:
    """``outcomes`` (pod -> outcome) as a status carries them: in pod order, at most
    MAX_DRAIN_OUTCOMES, each at most 300 characters, the rest counted."""
    names = sorted(outcomes)
    shown = [f"{p}: {outcomes[p]}"[:300] for p in names[:MAX_DRAIN_OUTCOMES]]
    if len(names) > MAX_DRAIN_OUTCOMES:
        shown.append(f"{MORE_PODS} {len(names) - MAX_DRAIN_OUTCOMES} more pods not listed")
    return tuple(shown)


class SignalData(BaseModel):
    """The whole signal annotation value."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    planId: str
    created: datetime
    command: SignalCommand
    status: SignalStatus | None = None
    traceparent: str | None = None

    @property
    def request_key(self) -> tuple[str, datetime]:
        """What identifies one request: a status is only ever written to the same key."""
        return (self.planId, self.created)

    def same_request(self, other: SignalData | None) -> bool:
        return other is not None and other.request_key == self.request_key

    def with_status(self, status: SignalStatus) -> SignalData:
        return self.model_copy(update={"status": status})

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


class InvalidSignalError(ValueError):
    """The signal annotation is present but unusable; the message says why."""


class _DuplicateKeyError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: a second "command" appended after the
    status must not replace the controller's (parsers disagree on which one wins)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(repr(key))
        out[key] = value
    return out


def parse_signal(annotations: dict[str, str] | None) -> SignalData | None:
    """Read the signal from an object's annotations.

    Returns None when there is no signal; raises InvalidSignalError with a readable
    reason when one is present but malformed.
    """
    annotations = annotations or {}
    raw = annotations.get(SIGNAL_DATA_KEY)
    if raw is None:
        return None
    version = annotations.get(SIGNAL_VERSION_KEY, SIGNAL_VERSION)
    if version != SIGNAL_VERSION:
        raise InvalidSignalError(f"unsupported {SIGNAL_VERSION_KEY} {version!r}")
    try:
        data: Any = json.loads(raw, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise InvalidSignalError(f"{SIGNAL_DATA_KEY} is not JSON: {e.msg} at {e.pos}") from None
    except _DuplicateKeyError as e:
        raise InvalidSignalError(f"{SIGNAL_DATA_KEY} has the key {e} twice") from None
    try:
        return SignalData.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in e.errors()
        )
        raise InvalidSignalError(f"{SIGNAL_DATA_KEY} invalid: {problems}") from None


def signal_annotations(data: SignalData) -> dict[str, str]:
    return {SIGNAL_VERSION_KEY: SIGNAL_VERSION, SIGNAL_DATA_KEY: data.to_json()}


STATUS_MEMBER = ',"status":'


def request_part(raw: str) -> str | None:
    """The controller's request inside a signal value, byte for byte: everything before
    the trailing ``,"status":{...}`` member (or before the closing brace when there is no
    status). None when ``raw`` is not in that shape.

    A quote inside a JSON string is always escaped, so ``,"status":`` outside the
    member can only be a key; the admission policy of the agent chart makes the same cut
    (``charts/k0s-fleet-agent/templates/signal-policy.yaml``).
    """
    text = raw.rstrip()
    cut = text.find(STATUS_MEMBER)
    if cut >= 0:
        return text[:cut]
    if not text.endswith("}"):
        return None
    return text[:-1]


def _status_member(status: SignalStatus) -> str:
    body = json.dumps(status.model_dump(mode="json", exclude_none=True),
                      separators=(",", ":"))
    # A flat object: every brace inside is inside a string. Escaped, the member matches
    # the admission policy's ^,"status":\{[^{}]*\}\}$ whatever the reason says.
    inner = body[1:-1].replace("{", "\\u007b").replace("}", "\\u007d")
    return STATUS_MEMBER + "{" + inner + "}"


def replace_status(raw: str, status: SignalStatus) -> str:
    """The signal value ``raw`` with its status replaced and every other field as written.

    The node side writes status this way rather than re-serialising its model, so that
    request fields it does not know (a newer controller's) survive its writes, and so
    that the request part stays byte for byte what the controller wrote (the admission
    policy lets nobody else change it): ``<request part>,"status":{...}}``.
    """
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise InvalidSignalError(f"{SIGNAL_DATA_KEY} is not a JSON object")
    request = request_part(raw)
    if request is not None:
        try:
            kept = json.loads(request + "}")
        except json.JSONDecodeError:
            kept = None
        data.pop("status", None)
        if kept == data and data:
            return request + _status_member(status) + "}"
    # Not in the usual shape (hand-written, status not last): re-serialise with status last.
    data.pop("status", None)
    member = _status_member(status)
    if not data:
        return "{" + member[1:] + "}"
    return json.dumps(data, separators=(",", ":"))[:-1] + member + "}"


def signal_digest(raw: str) -> str:
    """Identifies one exact signal value (for SIGNAL_REJECTED_KEY)."""
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]


# -- autopilot's signal (executor "autopilot") ------------------------------------------

# autopilot's node-side states, mapped to k0s-fleet's (PROTOCOLS §3).
AUTOPILOT_STATES: dict[str, SignalState] = {
    "Downloading": SignalState.DOWNLOADING,
    "Cordoning": SignalState.CORDONING,
    "ApplyingUpdate": SignalState.APPLYING_UPDATE,
    "Restart": SignalState.RESTARTING,
    "UnCordoning": SignalState.UNCORDONING,
    "Completed": SignalState.COMPLETED,
    "FailedDownload": SignalState.FAILED_DOWNLOAD,
}


@dataclass(frozen=True, slots=True)
class AutopilotSignal:
    plan_id: str
    created: str
    command_id: int
    version: str
    state: SignalState | None
    raw_state: str
    at: str = ""  # status.timestamp: when the node entered raw_state (its own clock)


def parse_autopilot_signal(raw: str | None) -> AutopilotSignal | None:
    if not raw:
        return None
    try:
        data = json.loads(raw)
        cmd = data.get("command") or {}
        status = data.get("status") or {}
        raw_state = str(status.get("status") or "")
        return AutopilotSignal(
            plan_id=str(data.get("planId") or ""), created=str(data.get("created") or ""),
            command_id=int(cmd.get("id") or 0),
            version=str((cmd.get("k0supdate") or {}).get("version") or ""),
            state=AUTOPILOT_STATES.get(raw_state), raw_state=raw_state,
            at=str(status.get("timestamp") or ""))
    except (ValueError, AttributeError, TypeError):
        return None
