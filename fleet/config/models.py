"""The fleet configuration: :class:`FleetConfig` and its sections.

Loading (YAML file + environment) is :mod:`fleet.config.loader`; errors are
:mod:`fleet.config.errors`; value types :mod:`fleet.config.types`; label selectors
:mod:`fleet.contract.selectors`; download resolution :mod:`fleet.config.downloads`.

YAML keys are camelCase (Kubernetes style); Python attributes are snake_case and may be
used when building models in Python. ``FleetConfig()`` is the all-defaults
configuration; it never reads files or the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Any, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    Field,
    field_validator,
    model_validator,
)

from fleet.config.schedule import CronError, format_duration, parse_cron
from fleet.config.schedule import zone as _zone
from fleet.config.types import (
    Arch,
    Budget,
    FailureBudget,
    NonNegativeDuration,
    Port,
    PositiveDuration,
    Sha256,
    VersionKey,
    check_url,
)
from fleet.contract.kubenames import ConfigModel, DnsLabel, LabelKey, LabelValue, ObjectName
from fleet.contract.problems import Problems
from fleet.contract.selectors import LabelSelector, parse_label_selector
from fleet.contract.signal import MAX_POLICY_SECONDS, DrainTimeoutAction, NodePolicy, SignalState
from fleet.contract.skew import ReleaseCatalog
from fleet.contract.versions import InvalidVersionError, K0sVersion

DEFAULT_URL_TEMPLATE = "https://get.k0sproject.io/{version}/k0s-{version}-{arch}"
DEFAULT_WAVE_NAME = "default"

class Executor(StrEnum):
    """Who carries out the upgrade on a node."""

    AGENT = "agent"  # the k0s-fleet agent, speaking the fleet's own signal
    AUTOPILOT = "autopilot"  # stock k0s autopilot on the node, via its signal protocol


class ExtensionMode(StrEnum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


# Bounds of the controller's fault detection (clusters.unreachableAfter,
# status.wedgedAfter): defaults and the least that makes sense.
UNREACHABLE_AFTER = timedelta(seconds=30)
MIN_UNREACHABLE_AFTER = timedelta(seconds=5)
WEDGED_AFTER = timedelta(seconds=180)
MIN_WEDGED_AFTER = timedelta(seconds=30)


def _at_least(least: timedelta, why: str) -> AfterValidator:
    """A duration's lower bound: the error says the bound, the value and ``why``."""
    def check(v: timedelta) -> timedelta:
        if v < least:
            raise ValueError(f"must be at least {format_duration(least)} (got "
                             f"{format_duration(v)}): {why}")
        return v
    return AfterValidator(check)


def _url(what: str, *schemes: str, why: str = "") -> AfterValidator:
    """A URL with one of ``schemes`` and a host; the error says ``what`` and ``why``."""
    def check(v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in schemes or not parts.hostname:
            raise ValueError(f"must be an {what} URL (got {v!r})" + (f": {why}" if why else ""))
        return v
    return AfterValidator(check)


CollectorUrl = Annotated[str, _url("http(s)", "http", "https")]
HooksUrl = Annotated[str, _url("https", "https", why="the hooks are served over TLS")]


# ---------------------------------------------------------------------------------------
# Models


class ManagementSettings(ConfigModel):
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


class MaintenanceWindow(ConfigModel):
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


class ClusterEntry(ConfigModel):
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


class KubeconfigSecretPolicy(ConfigModel):
    """What a workload cluster's kubeconfig Secret may hold beyond inline credentials
    (token, client certificate and key data, CA data, server, tls-server-name): whoever
    may write Secrets in a cluster's namespace writes it, so only the operator widens it."""

    allow_file_credentials: list[DnsLabel] = Field(
        default_factory=list,
        description="Namespaces whose kubeconfig Secrets may name files in the controller "
        "(tokenFile, client-certificate, client-key, certificate-authority), which the "
        "controller then reads and sends to the Secret's server. exec, auth-provider and "
        "proxy-url are never allowed.",
    )

    @field_validator("allow_file_credentials")
    @classmethod
    def _no_duplicates(cls, v: list[str]) -> list[str]:
        dup = sorted({ns for ns in v if v.count(ns) > 1})
        if dup:
            raise ValueError(f"duplicate namespace {dup[0]!r}")
        return v

    def allows_files(self, namespace: str) -> bool:
        return namespace in self.allow_file_credentials


class ClusterDiscovery(ConfigModel):
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
    unreachable_after: Annotated[PositiveDuration, _at_least(
        MIN_UNREACHABLE_AFTER, "a shorter bound marks a healthy cluster unreachable on one "
        "dropped watch and its retry")] = Field(
        UNREACHABLE_AFTER,
        description="A workload cluster whose watches (Nodes; ControlNodes and autopilot "
        "Plans where served) have failed this long without a success is unreachable: "
        "nothing new starts there until it answers again.",
    )
    kubeconfig_secrets: KubeconfigSecretPolicy = Field(
        default_factory=KubeconfigSecretPolicy,
        description="What kubeconfig Secrets may hold beyond inline credentials (refused "
        "otherwise, the cluster then unreachable with the field named).",
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
            raise Problems(problems)
        return self

    @property
    def selector(self) -> LabelSelector:
        return parse_label_selector(self.label_selector)

    def entry_for(self, namespace: str, name: str) -> ClusterEntry | None:
        for e in self.entries:
            if e.namespace == namespace and e.name == name:
                return e
        return None


class Wave(ConfigModel):
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
            raise Problems(
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


class ProgressDeadlines(ConfigModel):
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


class RolloutSettings(ConfigModel):
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
            raise Problems(problems)
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


class DownloadSettings(ConfigModel):
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
    releases: list[VersionKey] = Field(
        default_factory=list,
        description="The k0s releases the fleet may pass through on a ladder (a FleetUpgrade "
        "more than one minor ahead is carried out one minor at a time, on the newest patch "
        "of each minor between): this list together with the versions in `digests`.",
    )
    arches: list[Arch] = Field(
        default_factory=lambda: ["amd64", "arm64", "arm"],
        description="Node architectures the fleet supports.",
    )

    def catalog(self) -> ReleaseCatalog:
        """The releases a ladder may climb by (fleet/contract/skew.py)."""
        return ReleaseCatalog.of(
            self.releases, self.digests,
            rungs_need_digest=self.digest_manifest_url is None and not self.allow_unverified)

    @field_validator("url_template")
    @classmethod
    def _url_template(cls, v: str) -> str:
        fields = frozenset({"version", "arch"})
        return check_url(v, placeholders=fields, required=fields)

    @field_validator("digest_manifest_url")
    @classmethod
    def _manifest_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        return check_url(v, placeholders=frozenset({"version"}), required=frozenset())

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


class NodePolicySettings(ConfigModel):
    """The fleet config's ``agent:`` section: the node policy the controller hands to node
    agents with each request (not the agent process's own settings,
    :class:`fleet.agents.settings.AgentSettings`)."""

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
    delete_empty_dir_data: bool = Field(
        False, description="Drain evicts pods with emptyDir volumes, losing their data "
        "(kubectl drain --delete-emptydir-data); false: the drain fails, naming them.",
    )
    force: bool = Field(
        False, description="Drain evicts pods without a controller, which nothing recreates "
        "(kubectl drain --force); false: the drain fails, naming them.",
    )

    @field_validator("delete_empty_dir_data", "force", mode="before")
    @classmethod
    def _true_or_false(cls, v: object) -> object:
        # these evict what nothing brings back: only true or false (YAML, or the words
        # from the environment), never 1, "yes" or "on"
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("true", "false"):
            return v.lower() == "true"
        raise ValueError(f"must be true or false (got {v!r})")

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
            deleteEmptyDirData=self.delete_empty_dir_data,
            force=self.force,
        )


class TelemetrySettings(ConfigModel):
    """Traces of every rollout step."""

    otlp_endpoint: CollectorUrl | None = Field(
        None,
        description="OTLP/HTTP collector, e.g. http://otel-collector:4318 (/v1/traces is "
        "appended when no path is given); unset = OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, "
        "else no OTLP export.",
    )
    service_name: str | None = Field(
        None, min_length=1,
        description="OpenTelemetry service.name; unset = OTEL_SERVICE_NAME, else k0s-fleet.",
    )
    sampling_ratio: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Fraction of new traces recorded (parent-based); unset = "
        "OTEL_TRACES_SAMPLER/OTEL_TRACES_SAMPLER_ARG, else every trace.",
    )
    trace_file: str | None = Field(
        None, description="Append finished spans as JSON lines to this file."
    )


class ExtensionSettings(ConfigModel):
    """The Cluster API runtime extension serving the in-place update hooks."""

    enabled: bool = Field(False, description="Serve the runtime extension (HTTPS).")
    port: Port = Field(9443, description="HTTPS port of the extension.")
    cert_file: str | None = Field(None, description="TLS certificate (PEM); needed if enabled.")
    key_file: str | None = Field(None, description="TLS private key (PEM); needed if enabled.")
    service_name: DnsLabel | None = Field(
        None, description="Name of the Service that ExtensionConfigs use to reach this "
        "extension (the chart sets it). With serviceNamespace or url set, only an "
        "ExtensionConfig pointing at this endpoint counts as k0s-fleet's own: k0smotron's "
        "extension registers the same hook names.")
    service_namespace: DnsLabel | None = Field(
        None, description="Namespace of that Service (the chart sets it).")
    url: HooksUrl | None = Field(
        None, description="The URL ExtensionConfigs use to reach this extension, when "
        "they name a URL rather than a Service.")
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
        if bool(self.service_name) != bool(self.service_namespace):
            problems.append((("serviceName" if not self.service_name else "serviceNamespace",),
                             "serviceName and serviceNamespace go together"))
        if problems:
            raise Problems(problems)
        return self


class StatusSettings(ConfigModel):
    """The plain-HTTP status endpoint (metrics, health, status)."""

    port: Port = Field(8080, description="HTTP port for /metrics, /healthz and /status.")
    wedged_after: Annotated[PositiveDuration, _at_least(
        MIN_WEDGED_AFTER, "a planning pass of a large fleet on a busy API server may take "
        "that long, and the kubelet would restart a working controller")] = Field(
        WEDGED_AFTER,
        description="Liveness bound: /healthz answers 503 once a planning pass, or a change "
        "waiting for one, is older than this (or a watch has neither progressed nor failed "
        "for this long, and at least its request timeout plus a minute).",
    )


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


class FleetConfig(ConfigModel):
    """The whole fleet configuration. ``FleetConfig()`` is a working default config and
    never reads files or the environment; :func:`fleet.config.loader.load_config` does."""

    management: ManagementSettings = Field(default_factory=ManagementSettings)
    clusters: ClusterDiscovery = Field(default_factory=ClusterDiscovery)
    executor: Executor = Field(Executor.AGENT, description="Default executor: agent or autopilot.")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    download: DownloadSettings = Field(default_factory=DownloadSettings)
    agent: NodePolicySettings = Field(default_factory=NodePolicySettings)
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
            raise Problems(problems)
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


__all__ = [
    "DEFAULT_URL_TEMPLATE",
    "DEFAULT_WAVE_NAME",
    "ClusterDiscovery",
    "ClusterEntry",
    "ClusterSettings",
    "DownloadSettings",
    "Executor",
    "ExtensionMode",
    "ExtensionSettings",
    "FleetConfig",
    "KubeconfigSecretPolicy",
    "MaintenanceWindow",
    "ManagementSettings",
    "NodePolicySettings",
    "ProgressDeadlines",
    "RolloutSettings",
    "StatusSettings",
    "TelemetrySettings",
    "Wave",
]
