"""The fleet configuration: one YAML file plus environment overrides -> :class:`FleetConfig`.

:func:`load_config` is the single entry point. It reads the YAML file named by its
``path`` argument or by ``K0S_FLEET_CONFIG``, applies ``K0S_FLEET_<KEY>__<SUBKEY>``
environment overrides on top (the environment wins), and validates everything at once.
Anything wrong (a missing file, bad YAML, an unknown key, a wrong type, an impossible
value) raises :class:`ConfigError`, whose message has one line per problem, each naming
the dotted key path, e.g. ``rollout.waves[1].maxConcurrentClusters: must be >= 1``.

YAML keys are camelCase (Kubernetes style); Python attributes are snake_case and may be
used when building models in Python. ``FleetConfig()`` is the all-defaults
configuration; it never reads files or the environment.

Why not pydantic-settings' own sources: its environment source silently ignores unknown
variables (a typo would be a no-op), does not match camelCase aliases in nested keys, and
reads only ``os.environ``; as a root class, ``BaseSettings`` also lets snake_case keys
into files. The override layer here is small and strict instead.
"""

from __future__ import annotations

import json
import os
import re
import string
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NamedTuple, Self, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from fleet.schedule import CronError, DurationError, format_duration, parse_cron, parse_duration
from fleet.schedule import zone as _zone
from fleet.signal import ALLOWED_URL_SCHEMES, MAX_POLICY_SECONDS, NodePolicy, SignalState
from fleet.versions import InvalidVersionError, K0sVersion

ENV_PREFIX = "K0S_FLEET_"
CONFIG_PATH_ENV = "K0S_FLEET_CONFIG"
DEFAULT_URL_TEMPLATE = "https://get.k0sproject.io/{version}/k0s-{version}-{arch}"
DEFAULT_WAVE_NAME = "default"

# ---------------------------------------------------------------------------------------
# Errors


class ConfigProblem(NamedTuple):
    """One thing wrong with the configuration: where (dotted key path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(ValueError):
    """The fleet configuration is unusable. ``str()`` is one line per problem."""

    def __init__(self, problems: Sequence[ConfigProblem], source: str | None = None) -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__("\n".join(str(p) for p in self.problems))


class _Problems(ValueError):
    """Raised by model validators to report problems at paths relative to the model."""

    def __init__(self, problems: Sequence[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(m for _, m in self.problems))


# ---------------------------------------------------------------------------------------
# Scalar types


def _duration_in(value: Any) -> timedelta:
    try:
        return parse_duration(value)
    except DurationError as e:
        raise ValueError(str(e)) from None


def _positive(td: timedelta) -> timedelta:
    if td <= timedelta(0):
        raise ValueError(f"must be > 0s (got {format_duration(td)})")
    return td


def _non_negative(td: timedelta) -> timedelta:
    if td < timedelta(0):
        raise ValueError(f"must be >= 0s (got {format_duration(td)})")
    return td


_DurationSerializer = PlainSerializer(format_duration, return_type=str, when_used="json")
PositiveDuration = Annotated[
    timedelta, BeforeValidator(_duration_in), AfterValidator(_positive), _DurationSerializer
]
"""A duration > 0: Go-style string ("30s", "10m", "1h30m") or a number of seconds."""
NonNegativeDuration = Annotated[
    timedelta, BeforeValidator(_duration_in), AfterValidator(_non_negative), _DurationSerializer
]


@dataclass(frozen=True, slots=True)
class FailureBudget:
    """How many failures are tolerated: an absolute count or a percentage of a total."""

    value: int
    percent: bool = False

    @classmethod
    def parse(cls, raw: object) -> FailureBudget:
        if isinstance(raw, FailureBudget):
            return raw
        if isinstance(raw, bool):
            raise ValueError(f"must be a count or a percentage such as '10%' (got {raw!r})")
        if isinstance(raw, int):
            budget = cls(raw)
        elif isinstance(raw, str) and re.fullmatch(r"\s*\d+\s*%\s*", raw):
            budget = cls(int(raw.strip().rstrip("%")), percent=True)
        elif isinstance(raw, str) and re.fullmatch(r"\s*-?\d+\s*", raw):
            budget = cls(int(raw))
        else:
            raise ValueError(f"must be a count or a percentage such as '10%' (got {raw!r})")
        if budget.value < 0:
            raise ValueError(f"must be >= 0 (got {budget})")
        if budget.percent and budget.value > 100:
            raise ValueError(f"must be <= 100% (got {budget})")
        return budget

    def tolerated(self, total: int) -> int:
        """Failures tolerated out of ``total``; percentages round down (never more lenient
        than asked)."""
        if not self.percent:
            return self.value
        return total * self.value // 100

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def _budget_out(b: FailureBudget) -> int | str:
    return str(b) if b.percent else b.value


Budget = Annotated[
    FailureBudget,
    PlainValidator(FailureBudget.parse, json_schema_input_type=Union[int, str]),  # noqa: UP007
    PlainSerializer(_budget_out),
]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _dns_label(v: str) -> str:
    if len(v) > 63 or not _DNS_LABEL.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid DNS label (lowercase a-z, 0-9, '-', <= 63)")
    return v


def _dns_subdomain(v: str) -> str:
    if len(v) > 253 or not _DNS_SUBDOMAIN.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid Kubernetes object name (DNS subdomain)")
    return v


def _label_key(v: str) -> str:
    prefix, slash, name = v.rpartition("/")
    if (
        (slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)))
        or len(name) > 63
        or not _LABEL_NAME.fullmatch(name)
    ):
        raise ValueError(f"{v!r} is not a valid label key")
    return v


def _label_value(v: str) -> str:
    if v and (len(v) > 63 or not _LABEL_NAME.fullmatch(v)):
        raise ValueError(f"{v!r} is not a valid label value")
    return v


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
ObjectName = Annotated[str, AfterValidator(_dns_subdomain)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Port = Annotated[int, Field(ge=1, le=65535)]


def _check_url(v: str, *, placeholders: frozenset[str], required: frozenset[str]) -> str:
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
    except ValueError as e:
        raise ValueError(f"bad template {v!r}: {e}") from None
    unknown = names - placeholders
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {', '.join('{' + n + '}' for n in sorted(unknown))}; "
            f"allowed: {', '.join('{' + n + '}' for n in sorted(placeholders))}"
        )
    missing = required - names
    if missing:
        raise ValueError(
            f"must contain {' and '.join('{' + n + '}' for n in sorted(missing))} (got {v!r})"
        )
    sample = v.format(**{n: "x" for n in names})
    parts = urlsplit(sample)
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_URL_SCHEMES:
        raise ValueError(
            f"URL scheme {scheme or '(none)'!r} not allowed; use one of "
            f"{', '.join(sorted(ALLOWED_URL_SCHEMES))}"
        )
    if scheme != "file" and not parts.netloc:
        raise ValueError(f"URL {v!r} has no host")
    return v


class Executor(StrEnum):
    """Who carries out the upgrade on a node."""

    AGENT = "agent"  # the k0s-fleet agent, speaking the fleet's own signal
    AUTOPILOT = "autopilot"  # stock k0s autopilot on the node, via its signal protocol


class DrainTimeoutAction(StrEnum):
    FAIL = "fail"  # give up on the node (FailedDrain), uncordon it, count a failure
    PROCEED = "proceed"  # upgrade anyway once the drain timeout has passed


class ExtensionMode(StrEnum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


# ---------------------------------------------------------------------------------------
# Models


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(_Model):
    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[LabelValue] = Field(
        default_factory=list,
        description="Values for In / NotIn (non-empty); must be empty for Exists / DoesNotExist.",
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Self:
        has_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if has_values and not self.values:
            raise _Problems([(("values",), f"must not be empty for operator {self.operator}")])
        if not has_values and self.values:
            raise _Problems([(("values",), f"must be empty for operator {self.operator}")])
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        match self.operator:
            case SelectorOperator.IN:
                return present and labels[self.key] in self.values
            case SelectorOperator.NOT_IN:
                return not present or labels[self.key] not in self.values
            case SelectorOperator.EXISTS:
                return present
            case SelectorOperator.DOES_NOT_EXIST:
                return not present


class LabelSelector(_Model):
    """A Kubernetes label selector. An empty selector matches every cluster."""

    match_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, description="Labels that must all be present with these values."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Set-based requirements; all must hold."
    )

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


_SELECTOR_TERM = re.compile(
    r"""\s*(?:
        (?P<not>!)\s*(?P<nkey>[^\s!=,()]+)
      | (?P<skey>[^\s!=,()]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)
      | (?P<ekey>[^\s!=,()]+)\s*(?P<eq>==|=|!=)\s*(?P<val>[^\s!=,()]*)
      | (?P<xkey>[^\s!=,()]+)
    )\s*(?:,|$)""",
    re.VERBOSE,
)


def parse_label_selector(text: str) -> LabelSelector:
    """Parse the string form of a label selector (``a=b,c!=d,e in (x,y),!f,g``), as
    given to ``kubectl -l`` or the API's ``labelSelector`` parameter."""
    match_labels: dict[str, str] = {}
    exprs: list[LabelSelectorRequirement] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _SELECTOR_TERM.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot parse label selector {text!r} at {text[pos:]!r}")
        pos = m.end()
        if m["nkey"]:
            exprs.append(_requirement(m["nkey"], SelectorOperator.DOES_NOT_EXIST, []))
        elif m["skey"]:
            vals = [v.strip() for v in m["vals"].split(",") if v.strip()]
            op = SelectorOperator.IN if m["op"] == "in" else SelectorOperator.NOT_IN
            exprs.append(_requirement(m["skey"], op, vals))
        elif m["ekey"]:
            key, val = _label_key(m["ekey"]), _label_value(m["val"])
            if m["eq"] == "!=":
                exprs.append(_requirement(key, SelectorOperator.NOT_IN, [val]))
            elif match_labels.get(key, val) != val:
                raise ValueError(f"label selector {text!r} requires {key} to be two values")
            else:
                match_labels[key] = val
        else:
            exprs.append(_requirement(m["xkey"], SelectorOperator.EXISTS, []))
    return LabelSelector(match_labels=match_labels, match_expressions=exprs)


def _requirement(key: str, op: SelectorOperator, values: list[str]) -> LabelSelectorRequirement:
    try:
        return LabelSelectorRequirement(key=key, operator=op, values=values)
    except ValidationError as e:
        raise ValueError("; ".join(_message(err) for err in e.errors())) from None


class ManagementSettings(_Model):
    """How the controller reaches the management cluster (where Cluster API runs)."""

    kubeconfig: str | None = Field(
        None, description="Path of a kubeconfig file; unset = in-cluster service account."
    )
    context: str | None = Field(
        None, description="kubeconfig context to use; unset = the current context."
    )
    namespace: DnsLabel = Field(
        "k0s-fleet-system", description="Namespace the controller runs in (Lease, Events)."
    )


class MaintenanceWindow(_Model):
    """A recurring period during which upgrades may start."""

    schedule: str = Field(
        description="5-field cron expression (minute hour day-of-month month day-of-week) "
        "in time zone `timeZone`, or @daily/@weekly/...; each match opens the window."
    )
    duration: PositiveDuration = Field(
        description="How long the window stays open after each start (elapsed time)."
    )
    time_zone: str = Field("UTC", description="IANA time zone name, e.g. Europe/Berlin.")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        try:
            parse_cron(v)
        except CronError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("time_zone")
    @classmethod
    def _tz(cls, v: str) -> str:
        _zone(v)
        return v


class ClusterEntry(_Model):
    """Per-cluster settings for one CAPI Cluster; listing a cluster here also includes it
    in the fleet even when discovery would not select it."""

    name: ObjectName = Field(description="Name of the CAPI Cluster.")
    namespace: DnsLabel = Field("default", description="Namespace of the CAPI Cluster.")
    kubeconfig_secret: ObjectName | None = Field(
        None, description="Secret holding the workload kubeconfig; default <name>-kubeconfig."
    )
    executor: Executor | None = Field(None, description="Override of the fleet executor.")
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        description="Extra labels, laid over the Cluster's own for wave selection.",
    )
    maintenance_windows: list[MaintenanceWindow] | None = Field(
        None,
        description="Override of rollout.maintenanceWindows; [] = no restriction.",
    )
    paused: bool = Field(False, description="Start no new node upgrades in this cluster.")

    @property
    def kubeconfig_secret_name(self) -> str:
        return self.kubeconfig_secret or f"{self.name}-kubeconfig"


class ClusterDiscovery(_Model):
    """Which CAPI Clusters make up the fleet."""

    namespaces: list[DnsLabel] = Field(
        default_factory=list, description="Namespaces to watch for Clusters; empty = all."
    )
    label_selector: str = Field(
        "", description="Label selector (string form) that Clusters must match; empty = all."
    )
    entries: list[ClusterEntry] = Field(
        default_factory=list, description="Explicit clusters and per-cluster overrides."
    )

    @field_validator("label_selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        parse_label_selector(v)
        return v

    @model_validator(mode="after")
    def _unique(self) -> Self:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        seen_ns: set[str] = set()
        for i, ns in enumerate(self.namespaces):
            if ns in seen_ns:
                problems.append((("namespaces", i), f"duplicate namespace {ns!r}"))
            seen_ns.add(ns)
        seen: dict[tuple[str, str], int] = {}
        for i, e in enumerate(self.entries):
            key = (e.namespace, e.name)
            if key in seen:
                problems.append(
                    (("entries", i), f"duplicate of entries[{seen[key]}] ({e.namespace}/{e.name})")
                )
            seen.setdefault(key, i)
        if problems:
            raise _Problems(problems)
        return self

    @property
    def selector(self) -> LabelSelector:
        return parse_label_selector(self.label_selector)

    def entry_for(self, namespace: str, name: str) -> ClusterEntry | None:
        for e in self.entries:
            if e.namespace == namespace and e.name == name:
                return e
        return None


class Wave(_Model):
    """A group of clusters upgraded together; waves run one after another, in order."""

    name: DnsLabel = Field(description="Unique wave name, shown in status and metrics.")
    cluster_selector: LabelSelector = Field(
        default_factory=LabelSelector,
        description="Clusters in this wave (first matching wave wins); empty = all the rest.",
    )
    max_concurrent_clusters: int | None = Field(
        None, ge=1, description="Clusters upgrading at once; default rollout.maxConcurrentClusters."
    )
    soak: NonNegativeDuration = Field(
        timedelta(0),
        alias="soakSeconds",
        description="Wait after the wave completes before the next starts: seconds or a "
        "duration such as 10m.",
    )
    failure_budget: Budget = Field(
        FailureBudget(0),
        description="Failed clusters tolerated before the rollout halts: a count or '10%' "
        "of the wave's clusters (rounded down).",
    )
    canary: bool = Field(False, description="A canary wave tolerates no failure at all.")

    @model_validator(mode="after")
    def _canary_budget(self) -> Self:
        if self.canary and self.failure_budget.value != 0:
            raise _Problems(
                [(("failureBudget",), f"must be 0 in a canary wave (got {self.failure_budget})")]
            )
        return self

    def tolerated_failures(self, clusters_in_wave: int) -> int:
        return 0 if self.canary else self.failure_budget.tolerated(clusters_in_wave)


_DEFAULT_DEADLINES = {
    "pending": timedelta(minutes=5),
    "downloading": timedelta(minutes=15),
    "cordoning": timedelta(minutes=15),
    "applying_update": timedelta(minutes=5),
    "restarting": timedelta(minutes=10),
    "verifying": timedelta(minutes=10),
    "un_cordoning": timedelta(minutes=5),
}


class ProgressDeadlines(_Model):
    """How long a node may stay in one phase before its upgrade counts as failed."""

    pending: PositiveDuration = Field(
        _DEFAULT_DEADLINES["pending"],
        description="From the request until the node first answers.",
    )
    downloading: PositiveDuration = Field(_DEFAULT_DEADLINES["downloading"])
    cordoning: PositiveDuration = Field(
        _DEFAULT_DEADLINES["cordoning"], description="Cordon and drain."
    )
    applying_update: PositiveDuration = Field(_DEFAULT_DEADLINES["applying_update"])
    restarting: PositiveDuration = Field(
        _DEFAULT_DEADLINES["restarting"], description="Until k0s runs again after the restart."
    )
    verifying: PositiveDuration = Field(
        _DEFAULT_DEADLINES["verifying"], description="Health checks on the new version."
    )
    un_cordoning: PositiveDuration = Field(_DEFAULT_DEADLINES["un_cordoning"])

    def for_state(self, state: SignalState | str | None) -> timedelta | None:
        """The deadline of a phase (``None`` = not yet answered = pending); ``None`` for
        terminal states, which have none."""
        if not state:
            return self.pending
        try:
            phase = SignalState(state)
        except ValueError:
            return None
        return {
            SignalState.DOWNLOADING: self.downloading,
            SignalState.CORDONING: self.cordoning,
            SignalState.APPLYING_UPDATE: self.applying_update,
            SignalState.RESTARTING: self.restarting,
            SignalState.VERIFYING: self.verifying,
            SignalState.UNCORDONING: self.un_cordoning,
        }.get(phase)


class RolloutSettings(_Model):
    """How upgrades progress across the fleet."""

    waves: list[Wave] = Field(
        default_factory=list,
        description="Ordered waves; clusters matching none go to a final 'default' wave.",
    )
    max_concurrent_clusters: int = Field(
        1, ge=1, description="Clusters upgrading at once, for waves that do not say."
    )
    progress_deadlines: ProgressDeadlines = Field(default_factory=ProgressDeadlines)
    failure_budget: int = Field(
        1,
        ge=1,
        description="Failed nodes at which a MachineDeployment or K0sControlPlane halts "
        "(1 = the first failed node halts it).",
    )
    maintenance_windows: list[MaintenanceWindow] = Field(
        default_factory=list,
        description="When node upgrades may start; empty = any time.",
    )
    paused: bool = Field(
        False, description="Start no new cluster or node upgrade; running ones finish."
    )
    emergency_stop: bool = Field(
        False,
        description="Stop everything: start nothing and advance no in-flight node upgrade.",
    )

    @model_validator(mode="after")
    def _wave_names(self) -> Self:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        seen: dict[str, int] = {}
        for i, w in enumerate(self.waves):
            if w.name in seen:
                problems.append(
                    (
                        ("waves", i, "name"),
                        f"duplicate wave name {w.name!r} (waves[{seen[w.name]}])",
                    )
                )
            seen.setdefault(w.name, i)
            if w.name == DEFAULT_WAVE_NAME and not w.cluster_selector.empty:
                problems.append(
                    (
                        ("waves", i, "name"),
                        f"{DEFAULT_WAVE_NAME!r} is reserved for the wave of all remaining "
                        "clusters; give it an empty clusterSelector or another name",
                    )
                )
        if problems:
            raise _Problems(problems)
        return self

    @property
    def effective_waves(self) -> tuple[Wave, ...]:
        """The configured waves plus, unless one already selects everything, a final
        ``default`` wave holding every cluster no other wave matched."""
        if any(w.cluster_selector.empty for w in self.waves):
            return tuple(self.waves)
        return (*self.waves, Wave(name=DEFAULT_WAVE_NAME))

    def wave_for(self, labels: Mapping[str, str]) -> Wave:
        """The first wave whose selector matches a cluster's labels."""
        for w in self.effective_waves:
            if w.cluster_selector.matches(labels):
                return w
        raise AssertionError("the last effective wave matches every cluster")

    def concurrency(self, wave: Wave) -> int:
        return wave.max_concurrent_clusters or self.max_concurrent_clusters


Arch = Annotated[str, Field(pattern=r"^[a-z0-9_]+$")]


def _sha256(v: object) -> str:
    if not isinstance(v, str):
        raise ValueError(f"must be a sha256 hex string (got {v!r})")
    d = v.strip().lower().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", d):
        raise ValueError(f"must be 64 hex characters (got {v!r})")
    return d


def _version_key(v: str) -> str:
    try:
        return str(K0sVersion.parse(v))
    except InvalidVersionError as e:
        raise ValueError(str(e)) from None


Sha256 = Annotated[str, PlainValidator(_sha256, json_schema_input_type=str)]
VersionKey = Annotated[str, AfterValidator(_version_key)]


class DownloadSettings(_Model):
    """Where nodes fetch k0s binaries, and how they are verified."""

    url_template: str = Field(
        DEFAULT_URL_TEMPLATE,
        description="Binary URL with {version} and {arch}; http, https or file.",
    )
    digests: dict[VersionKey, dict[Arch, Sha256]] = Field(
        default_factory=dict,
        description="Pinned sha256 digests: version -> arch -> hex digest.",
    )
    digest_manifest_url: str | None = Field(
        None,
        description="URL of a sha256sums-style file (may contain {version}) listing the "
        "digests of the binaries by file name.",
    )
    allow_unverified: bool = Field(
        False, description="Allow installing a binary for which no digest is known."
    )
    arches: list[Arch] = Field(
        default_factory=lambda: ["amd64", "arm64", "arm"],
        description="Node architectures the fleet supports.",
    )

    @field_validator("url_template")
    @classmethod
    def _url_template(cls, v: str) -> str:
        fields = frozenset({"version", "arch"})
        return _check_url(v, placeholders=fields, required=fields)

    @field_validator("digest_manifest_url")
    @classmethod
    def _manifest_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        return _check_url(v, placeholders=frozenset({"version"}), required=frozenset())

    @field_validator("digests", mode="before")
    @classmethod
    def _distinct_versions(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            seen: dict[str, str] = {}
            for key in v:
                try:
                    norm = str(K0sVersion.parse(key))
                except InvalidVersionError:
                    continue  # reported by key validation
                if norm in seen:
                    raise ValueError(f"{seen[norm]!r} and {key!r} name the same k0s version")
                seen[norm] = str(key)
        return v


class AgentSettings(_Model):
    """Defaults the controller hands to node agents with each request."""

    drain_timeout: PositiveDuration = Field(
        timedelta(minutes=5), description="How long the agent tries to drain its node."
    )
    drain_timeout_action: DrainTimeoutAction = Field(
        DrainTimeoutAction.FAIL,
        description="What to do when the drain timeout passes: fail or proceed.",
    )
    verify_timeout: PositiveDuration = Field(
        timedelta(minutes=5),
        description="How long the new version may take to become healthy before rollback.",
    )

    @field_validator("drain_timeout", "verify_timeout")
    @classmethod
    def _fits_a_request(cls, v: timedelta) -> timedelta:
        if v.total_seconds() > MAX_POLICY_SECONDS:
            limit = format_duration(timedelta(seconds=MAX_POLICY_SECONDS))
            raise ValueError(f"must be at most {limit}")
        return v

    def node_policy(self) -> NodePolicy:
        """What each request to an agent carries (executor ``agent`` only)."""
        return NodePolicy(
            drainTimeoutSeconds=self.drain_timeout.total_seconds(),
            drainTimeoutAction=self.drain_timeout_action.value,
            verifyTimeoutSeconds=self.verify_timeout.total_seconds(),
        )


class TelemetrySettings(_Model):
    """Traces of every rollout step."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector, e.g. http://otel-collector:4318 (/v1/traces is "
        "appended when no path is given); unset = no OTLP export.",
    )
    service_name: str = Field("k0s-fleet", min_length=1, description="OpenTelemetry service.name")
    sampling_ratio: float = Field(
        1.0, ge=0.0, le=1.0, description="Fraction of new traces recorded (parent-based)."
    )
    trace_file: str | None = Field(
        None, description="Append finished spans as JSON lines to this file."
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"must be an http(s) URL (got {v!r})")
        return v


class ExtensionSettings(_Model):
    """The Cluster API runtime extension serving the in-place update hooks."""

    enabled: bool = Field(False, description="Serve the runtime extension (HTTPS).")
    port: Port = Field(9443, description="HTTPS port of the extension.")
    cert_file: str | None = Field(None, description="TLS certificate (PEM); needed if enabled.")
    key_file: str | None = Field(None, description="TLS private key (PEM); needed if enabled.")
    mode: ExtensionMode = Field(
        ExtensionMode.AUTO,
        description="Who drives in-place upgrades, so that never both do: 'always' = only "
        "through CAPI's hooks; 'never' = only k0s-fleet's own waves; 'auto' = the hooks "
        "for objects CAPI updates in place, the waves for the rest.",
    )

    @model_validator(mode="after")
    def _tls(self) -> Self:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if self.enabled:
            if not self.cert_file:
                problems.append((("certFile",), "required when extension.enabled is true"))
            if not self.key_file:
                problems.append((("keyFile",), "required when extension.enabled is true"))
        elif self.mode is ExtensionMode.ALWAYS:
            problems.append((("mode",), "'always' needs extension.enabled: true"))
        if problems:
            raise _Problems(problems)
        return self


class StatusSettings(_Model):
    """The plain-HTTP status endpoint (metrics, health, status)."""

    port: Port = Field(8080, description="HTTP port for /metrics, /healthz and /status.")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """The effective settings of one workload cluster (fleet defaults + its entry)."""

    namespace: str
    name: str
    kubeconfig_secret: str
    executor: Executor
    labels: Mapping[str, str]
    maintenance_windows: tuple[MaintenanceWindow, ...]
    paused: bool
    wave: Wave


class FleetConfig(_Model):
    """The whole fleet configuration. ``FleetConfig()`` is a working default config and
    never reads files or the environment; :func:`load_config` does."""

    management: ManagementSettings = Field(default_factory=ManagementSettings)
    clusters: ClusterDiscovery = Field(default_factory=ClusterDiscovery)
    executor: Executor = Field(Executor.AGENT, description="Default executor: agent or autopilot.")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    download: DownloadSettings = Field(default_factory=DownloadSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    extension: ExtensionSettings = Field(default_factory=ExtensionSettings)
    status: StatusSettings = Field(default_factory=StatusSettings)

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        deadlines = self.rollout.progress_deadlines
        if self.agent.drain_timeout >= deadlines.cordoning:
            problems.append(
                (
                    ("agent", "drainTimeout"),
                    f"must be shorter than rollout.progressDeadlines.cordoning "
                    f"({format_duration(self.agent.drain_timeout)} >= "
                    f"{format_duration(deadlines.cordoning)})",
                )
            )
        if self.agent.verify_timeout >= deadlines.verifying:
            problems.append(
                (
                    ("agent", "verifyTimeout"),
                    f"must be shorter than rollout.progressDeadlines.verifying "
                    f"({format_duration(self.agent.verify_timeout)} >= "
                    f"{format_duration(deadlines.verifying)})",
                )
            )
        if self.extension.enabled and self.extension.port == self.status.port:
            problems.append(
                (("extension", "port"), f"must differ from status.port ({self.status.port})")
            )
        if problems:
            raise _Problems(problems)
        return self

    def for_cluster(
        self, namespace: str, name: str, labels: Mapping[str, str] | None = None
    ) -> ClusterSettings:
        """Effective settings of the Cluster ``namespace/name`` whose labels are ``labels``."""
        entry = self.clusters.entry_for(namespace, name)
        merged = {**(labels or {}), **(entry.labels if entry else {})}
        windows = self.rollout.maintenance_windows
        if entry is not None and entry.maintenance_windows is not None:
            windows = entry.maintenance_windows
        return ClusterSettings(
            namespace=namespace,
            name=name,
            kubeconfig_secret=entry.kubeconfig_secret_name if entry else f"{name}-kubeconfig",
            executor=(entry.executor if entry and entry.executor else self.executor),
            labels=merged,
            maintenance_windows=tuple(windows),
            paused=self.rollout.paused or bool(entry and entry.paused),
            wave=self.rollout.wave_for(merged),
        )


# ---------------------------------------------------------------------------------------
# Loading


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> FleetConfig:
    """Load the fleet configuration.

    ``path`` (else ``env["K0S_FLEET_CONFIG"]``) names a YAML file; without either, the
    defaults apply. ``env`` (default: ``os.environ``) supplies overrides such as
    ``K0S_FLEET_ROLLOUT__MAX_CONCURRENT_CLUSTERS=3``; they win over the file. Raises
    :class:`ConfigError` listing every problem found.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    source = os.fspath(path) if path is not None else (environ.get(CONFIG_PATH_ENV) or None)
    problems: list[ConfigProblem] = []
    data: dict[str, Any] = {}
    if source is not None:
        data, file_problems = _read_yaml(source)
        problems += file_problems
    overrides, origins, env_problems = _env_overrides(environ)
    problems += env_problems
    if problems:
        raise ConfigError(problems, source)
    merged = _deep_merge(data, overrides)
    try:
        return FleetConfig.model_validate(merged, by_alias=True, by_name=False)
    except ValidationError as e:
        raise ConfigError(_problems_from(e, origins), source) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _read_yaml(source: str) -> tuple[dict[str, Any], list[ConfigProblem]]:
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, [ConfigProblem(source, "config file not found")]
    except (OSError, UnicodeDecodeError) as e:
        return {}, [ConfigProblem(source, f"cannot read config file: {e}")]
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        return {}, [ConfigProblem(source, f"{where}invalid YAML: {what}")]
    except yaml.YAMLError as e:
        return {}, [ConfigProblem(source, f"invalid YAML: {e}")]
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return {}, [
            ConfigProblem(source, f"must be a YAML mapping at the top (got {type(data).__name__})")
        ]
    return data, []


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _strip_annotation(tp: Any) -> tuple[Any, bool]:
    """The annotation without ``Annotated`` / ``| None``, and whether None was allowed."""
    optional = False
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin is Union or origin is types.UnionType:
            args = [a for a in get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(get_args(tp))
            if len(args) != 1:
                return tp, optional
            tp = args[0]
        else:
            return tp, optional


def _norm(s: str) -> str:
    return s.replace("_", "").lower()


def _env_overrides(
    env: Mapping[str, str],
) -> tuple[dict[str, Any], dict[tuple[str, ...], str], list[ConfigProblem]]:
    """``K0S_FLEET_A__B__C=value`` -> ``{"a": {"b": {"c": value}}}`` (by YAML key).

    Segments match keys case-insensitively, with or without underscores (both
    ``MAX_CONCURRENT_CLUSTERS`` and ``MAXCONCURRENTCLUSTERS`` name
    ``maxConcurrentClusters``). Values of lists, mappings and sections are YAML/JSON.
    Prefixed variables without ``__`` that name no top-level key are left alone: they
    belong to other parts of k0s-fleet.
    """
    data: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    problems: list[ConfigProblem] = []
    for var in sorted(env):
        if not var.upper().startswith(ENV_PREFIX) or var.upper() == CONFIG_PATH_ENV:
            continue
        segments = var[len(ENV_PREFIX) :].split("__")
        model: type[BaseModel] | None = FleetConfig
        path: list[str] = []
        leaf: Any = None
        optional = False
        for seg in segments:
            if model is None:
                problems.append(ConfigProblem(var, f"{'.'.join(path)} has no sub-keys (in {var})"))
                break
            found = None
            for name, field in model.model_fields.items():
                alias = field.alias or name
                if _norm(seg) in (_norm(alias), _norm(name)):
                    found = (alias, field)
                    break
            if found is None:
                if len(segments) > 1 or path:
                    where = ".".join([*path, seg.lower()])
                    problems.append(ConfigProblem(var, f"unknown key {where}"))
                break
            alias, field = found
            path.append(alias)
            leaf, optional = _strip_annotation(field.annotation)
            model = leaf if isinstance(leaf, type) and issubclass(leaf, BaseModel) else None
        else:
            value = env[var]
            complex_leaf = model is not None or get_origin(leaf) in (list, dict)
            parsed: Any = value
            if optional and value.strip() == "":
                parsed = None
            elif complex_leaf:
                try:
                    parsed = yaml.load(value, Loader=_StrictLoader)
                except yaml.YAMLError as e:
                    problems.append(
                        ConfigProblem(".".join(path), f"invalid YAML/JSON in {var}: {e}")
                    )
                    continue
            node = data
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = parsed
            origins[tuple(path)] = var
    return data, origins, problems


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "(top level)"


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def _message(err: Mapping[str, Any]) -> str:
    t = err["type"]
    ctx = err.get("ctx") or {}
    got = f" (got {_short(err.get('input'))})"
    simple = {
        "extra_forbidden": "unknown key",
        "missing": "required",
        "list_type": "must be a list" + got,
        "dict_type": "must be a mapping" + got,
        "model_type": "must be a mapping" + got,
        "model_attributes_type": "must be a mapping" + got,
        "string_type": "must be a string" + got,
        "bool_type": "must be true or false" + got,
        "bool_parsing": "must be true or false" + got,
        "int_type": "must be an integer" + got,
        "int_parsing": "must be an integer" + got,
        "int_from_float": "must be an integer" + got,
        "float_type": "must be a number" + got,
        "float_parsing": "must be a number" + got,
        "string_pattern_mismatch": f"must match {ctx.get('pattern')}" + got,
    }
    if t in simple:
        return simple[t]
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if t in bounds:
        op, key = bounds[t]
        return f"must be {op} {ctx.get(key)}"
    if t == "string_too_short":
        return "must not be empty"
    if t == "enum":
        return f"must be one of {ctx.get('expected')}" + got
    if t in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    return str(err.get("msg", t))


def _problems_from(
    e: ValidationError, origins: Mapping[tuple[str, ...], str]
) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for err in e.errors(include_url=False):
        loc = tuple(err["loc"])
        inner = (err.get("ctx") or {}).get("error")
        pairs = (
            [(loc + rel, msg) for rel, msg in inner.problems]
            if isinstance(inner, _Problems)
            else [(loc, _message(err))]
        )
        for full, msg in pairs:
            var = next((v for p, v in origins.items() if tuple(full[: len(p)]) == p), None)
            suffix = f" (from {var})" if var else ""
            problems.append(ConfigProblem(_format_path(full), msg + suffix))
    return problems


__all__ = [
    "CONFIG_PATH_ENV",
    "DEFAULT_URL_TEMPLATE",
    "DEFAULT_WAVE_NAME",
    "ENV_PREFIX",
    "AgentSettings",
    "ClusterDiscovery",
    "ClusterEntry",
    "ClusterSettings",
    "ConfigError",
    "ConfigProblem",
    "DownloadSettings",
    "DrainTimeoutAction",
    "Executor",
    "ExtensionMode",
    "ExtensionSettings",
    "FailureBudget",
    "FleetConfig",
    "LabelSelector",
    "LabelSelectorRequirement",
    "MaintenanceWindow",
    "ManagementSettings",
    "ProgressDeadlines",
    "RolloutSettings",
    "StatusSettings",
    "TelemetrySettings",
    "Wave",
    "load_config",
    "parse_label_selector",
]
