"""The agent's configuration: environment (K0S_FLEET_AGENT_*) overridden by CLI flags.

The flags are generated from this model (:mod:`fleet.cli.agent`): a field's flag is its
name in kebab case, its help the field's description; each field's variable is
``K0S_FLEET_AGENT_<FIELD>``. :func:`environment_problems` names every other
``K0S_FLEET_AGENT_*`` variable, so a typo or the controller's spelling is not ignored."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet.agents.state import url_prefix_problem
from fleet.contract.signal import (
    AGENT_ENV_PREFIX,
    DrainRule,
    DrainTimeoutAction,
    NodePolicy,
    misplaced_policy_variable,
)

# Where k0s releases come from unless the agent is told otherwise: the fixed part of the
# fleet config's default download.urlTemplate (fleet.config.models.DEFAULT_URL_TEMPLATE).
DEFAULT_RELEASE_PREFIX = "https://get.k0sproject.io/"
# Where that location's downloads redirect to (GitHub's release downloads and the CDN
# they hand over to): every redirect hop must lie under an accepted prefix too.
DEFAULT_REDIRECT_PREFIXES = (
    "https://github.com/k0sproject/k0s/releases/download/",
    "https://objects.githubusercontent.com/github-production-release-asset-2e65be/",
    "https://release-assets.githubusercontent.com/github-production-release-asset/",
)


ENV_PREFIX = AGENT_ENV_PREFIX
# Test-only fault injection (fleet.agents.agent.crash_point): shares the prefix, is no setting.
CRASH_ENV = "K0S_FLEET_AGENT_CRASH_AT"


class SignalObject(StrEnum):
    """Which object carries this node's signal."""

    NODE = "node"
    # A pure k0s controller has no Node; autopilot's ControlNode stands in for it.
    CONTROL_NODE = "controlnode"


class RestartStrategy(StrEnum):
    SYSTEMD = "systemd"
    SIGNAL = "signal"
    COMMAND = "command"


class VersionSource(StrEnum):
    # k0s's status API over its unix socket: Version and Pid of the running process.
    STATUS_SOCKET = "status-socket"
    # `<binary> version` plus a live pid (pid file or systemd MainPID) that changed.
    BINARY = "binary"


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The drain/verify policy one request runs with."""

    drain_timeout: float
    drain_timeout_action: DrainTimeoutAction
    verify_timeout: float
    delete_empty_dir_data: bool = False
    force: bool = False
    skip_pods: tuple[dict[str, Any], ...] = ()
    drain_rules: tuple[DrainRule, ...] = ()


class HostNamespace(StrEnum):
    """Whether systemctl runs via nsenter into the host's namespaces."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    node_name: str = Field(min_length=1, description="this node's Node (or ControlNode) name")
    signal_object: SignalObject = Field(
        SignalObject.NODE, description="object carrying the signal (controlnode: pure k0s "
        "controller without a Node)")
    role: str = Field("worker", description="k0s role: worker or controller (service k0s<role>)")

    k0s_binary: Path = Field(Path("/usr/local/bin/k0s"), description="installed k0s binary")
    # Intent markers that make restarts happen once per request; must survive the agent
    # (a hostPath when the agent runs in a pod).
    state_dir: Path = Field(Path("/var/lib/k0s-fleet-agent"), description="durable intent "
                            "markers and the host lock")

    restart_strategy: RestartStrategy = RestartStrategy.SIGNAL
    service_name: str | None = Field(None, description="systemd unit (default k0s<role>)")
    restart_signal: str = Field("SIGTERM", description="signal for restart strategy signal")
    restart_command: str | None = Field(None, description="command line for restart "
                                        "strategy command")
    # A restart recorded as issued while the very same k0s process still runs: how long
    # to let it take effect before issuing it again (see state.restart_action).
    restart_grace: float = Field(default=20.0, ge=0, description="seconds a recorded restart "
                                 "gets to replace the process before re-issuing")
    restart_timeout: float = Field(default=120.0, gt=0, description="seconds a restart "
                                   "command (systemctl/--restart-command) may take; not the "
                                   "verify timeout")
    host_namespace: HostNamespace = Field(HostNamespace.AUTO, description="run "
                                          "systemctl/commands via nsenter into pid 1's namespaces")

    version_source: VersionSource = VersionSource.STATUS_SOCKET
    status_socket: Path | None = Field(Path("/run/k0s/status.sock"), description="k0s "
                                       "status socket ('' for none)")
    pid_file: Path | None = Field(None, description="k0s pid file (when there is no status "
                                  "socket)")

    download_attempts: int = Field(default=5, ge=1)
    download_stall_timeout: float = Field(default=30.0, gt=0, description="seconds without data")
    download_timeout: float = Field(default=900.0, gt=0,
                                    description="seconds for the whole download")
    download_backoff_initial: float = Field(default=1.0, gt=0)
    download_backoff_max: float = Field(default=30.0, gt=0)
    max_binary_bytes: int = Field(default=2 * 1024**3, gt=0)
    free_space_margin_bytes: int = Field(default=64 * 1024**2, ge=0, description="free "
                                         "space to keep beside the staged binary")
    allow_unverified: bool = Field(False, description="accept requests without sha256 when "
                                   "they explicitly allow it")
    file_url_roots: tuple[Path, ...] = Field((), description="directory file: URLs may read "
                                             "from (repeatable; default: none)")
    # http(s) download URLs must lie under one of these (scheme, host, port, path prefix);
    # anything else is refused (InvalidRequest) before anything is touched, and so is every
    # redirect hop (FailedDownload). file: URLs are judged by file_url_roots instead.
    allowed_url_prefixes: tuple[str, ...] = Field(
        (DEFAULT_RELEASE_PREFIX, *DEFAULT_REDIRECT_PREFIXES),
        description="http(s) download URLs, and every redirect hop, must lie under this "
        f"prefix (repeatable; default: {DEFAULT_RELEASE_PREFIX}, the fleet's default "
        "release location, and the GitHub release locations it redirects to)")

    drain: bool = Field(True, description="evict pods (without it: cordon only)")
    drain_timeout: float = Field(default=300.0, gt=0)
    drain_timeout_action: DrainTimeoutAction = DrainTimeoutAction.FAIL
    delete_empty_dir_data: bool = Field(
        False, description="drain: evict pods with emptyDir volumes, losing their data "
        "(default: refuse the drain, naming them)")
    force: bool = Field(
        False, description="drain: evict pods without a controller, which nothing recreates "
        "(default: refuse the drain, naming them)")

    verify_timeout: float = Field(default=180.0, gt=0)
    # With version_source=binary: how long the new process must stay up to count.
    verify_stable_seconds: float = Field(default=3.0, ge=0)
    require_node_ready: bool = True
    rollback_timeout: float = Field(default=180.0, gt=0)

    kubeconfig: Path | None = Field(None, description="kubeconfig file (default: in-cluster)")
    log_level: str = "INFO"
    # Tracing: the request's upgrade span and one child span per step, in the trace of
    # the controller's dispatch (the request's traceparent). Unset values fall back to
    # the OTEL_* environment (fleet.telemetry.setup_tracing).
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP collector for spans (default: "
        "OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT)")
    otel_service_name: str | None = Field(
        None, min_length=1,
        description="OpenTelemetry service.name (default: OTEL_SERVICE_NAME, else "
        "k0s-fleet-agent)")
    trace_sampling_ratio: float | None = Field(
        None, ge=0.0, le=1.0,
        description="fraction of new traces recorded (default: OTEL_TRACES_SAMPLER[_ARG], "
        "else all)")
    trace_file: Path | None = Field(None, description="append spans as JSON lines")

    @field_validator("allowed_url_prefixes", mode="before")
    @classmethod
    def _prefix_list(cls, v: object) -> object:
        """A JSON list (as the chart sets it) or comma-separated prefixes, as text."""
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                return json.loads(text)
            return [p.strip() for p in text.split(",") if p.strip()]
        return v

    @field_validator("allowed_url_prefixes")
    @classmethod
    def _prefixes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for prefix in v:
            problem = url_prefix_problem(prefix)
            if problem:
                raise ValueError(f"allowed URL prefix {prefix!r}: {problem}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> AgentSettings:
        if self.restart_strategy is RestartStrategy.COMMAND and not self.restart_command:
            raise ValueError("restart_strategy=command needs restart_command")
        if self.version_source is VersionSource.STATUS_SOCKET and self.status_socket is None:
            raise ValueError("version_source=status-socket needs status_socket")
        if (self.restart_strategy is RestartStrategy.SIGNAL and self.status_socket is None
                and self.pid_file is None):
            raise ValueError("restart_strategy=signal needs status_socket or pid_file")
        return self

    def policy_for(self, requested: NodePolicy | None) -> EffectivePolicy:
        """Precedence, per value: the request's policy (the fleet config's ``agent:``
        section, sent by the controller) > this agent's flags/environment > defaults.
        Applies to that one request only."""
        req = requested or NodePolicy()
        return EffectivePolicy(
            drain_timeout=req.drainTimeoutSeconds if req.drainTimeoutSeconds is not None
            else self.drain_timeout,
            drain_timeout_action=req.drainTimeoutAction
            if req.drainTimeoutAction is not None else self.drain_timeout_action,
            verify_timeout=req.verifyTimeoutSeconds if req.verifyTimeoutSeconds is not None
            else self.verify_timeout,
            delete_empty_dir_data=req.deleteEmptyDirData
            if req.deleteEmptyDirData is not None else self.delete_empty_dir_data,
            force=req.force if req.force is not None else self.force,
            skip_pods=req.skipPods or (),
            drain_rules=req.drainRules or (),
        )

    @property
    def unit(self) -> str:
        return self.service_name or f"k0s{self.role}"

    @property
    def has_node(self) -> bool:
        return self.signal_object is SignalObject.NODE


def environment_problems(environ: Mapping[str, str]) -> list[str]:
    """One line per ``K0S_FLEET_AGENT_*`` variable of ``environ`` that names no setting
    (pydantic-settings would ignore it), saying which variable was probably meant."""
    problems: list[str] = []
    for var in sorted(environ):
        upper = var.upper()
        if not upper.startswith(ENV_PREFIX) or upper == CRASH_ENV:
            continue
        rest = upper[len(ENV_PREFIX):]
        if rest.lower() in AgentSettings.model_fields:
            continue
        key = rest.lstrip("_")
        misplaced = misplaced_policy_variable(var, on_agent=True)
        if misplaced is not None:
            problems.append(f"{var}: {misplaced}")
        elif key.lower() in AgentSettings.model_fields:
            problems.append(f"{var}: no such agent setting; did you mean {ENV_PREFIX}{key}?")
        else:
            problems.append(f"{var}: no such agent setting (the settings are "
                            f"{ENV_PREFIX}<FLAG>, one per flag of k0s-fleet agent)")
    return problems
