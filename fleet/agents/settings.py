"""The agent's configuration: environment (K0S_FLEET_AGENT_*) overridden by CLI flags."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet.signal import NodePolicy


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


class DrainTimeoutOutcome(StrEnum):
    FAIL = "fail"
    PROCEED = "proceed"


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The drain/verify policy one request runs with."""

    drain_timeout: float
    drain_timeout_outcome: DrainTimeoutOutcome
    verify_timeout: float


class HostNamespace(StrEnum):
    """Whether systemctl runs via nsenter into the host's namespaces."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="K0S_FLEET_AGENT_", extra="forbid",
                                      frozen=True)

    node_name: str = Field(min_length=1)
    signal_object: SignalObject = SignalObject.NODE
    role: str = "worker"

    k0s_binary: Path = Path("/usr/local/bin/k0s")
    # Intent markers that make restarts happen once per request; must survive the agent
    # (a hostPath when the agent runs in a pod).
    state_dir: Path = Path("/var/lib/k0s-fleet-agent")

    restart_strategy: RestartStrategy = RestartStrategy.SIGNAL
    service_name: str | None = None  # default k0s<role>, e.g. k0sworker
    restart_signal: str = "SIGTERM"
    restart_command: str | None = None
    # A restart recorded as issued while the very same k0s process still runs: how long
    # to let it take effect before issuing it again (see state.restart_action).
    restart_grace: float = Field(default=20.0, ge=0)
    host_namespace: HostNamespace = HostNamespace.AUTO

    version_source: VersionSource = VersionSource.STATUS_SOCKET
    status_socket: Path | None = Path("/run/k0s/status.sock")
    pid_file: Path | None = None

    download_attempts: int = Field(default=5, ge=1)
    download_stall_timeout: float = Field(default=30.0, gt=0)
    download_timeout: float = Field(default=900.0, gt=0)
    download_backoff_initial: float = Field(default=1.0, gt=0)
    download_backoff_max: float = Field(default=30.0, gt=0)
    max_binary_bytes: int = Field(default=2 * 1024**3, gt=0)
    free_space_margin_bytes: int = Field(default=64 * 1024**2, ge=0)
    allow_unverified: bool = False
    file_url_roots: tuple[Path, ...] = ()

    drain: bool = True
    drain_timeout: float = Field(default=300.0, gt=0)
    drain_timeout_outcome: DrainTimeoutOutcome = DrainTimeoutOutcome.FAIL

    verify_timeout: float = Field(default=180.0, gt=0)
    # With version_source=binary: how long the new process must stay up to count.
    verify_stable_seconds: float = Field(default=3.0, ge=0)
    require_node_ready: bool = True
    rollback_timeout: float = Field(default=180.0, gt=0)

    kubeconfig: Path | None = None  # None: in-cluster service account
    log_level: str = "INFO"
    # Tracing (spans per step, linked to the request's traceparent).
    otlp_endpoint: str | None = None
    trace_file: Path | None = None

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
            drain_timeout_outcome=DrainTimeoutOutcome(req.drainTimeoutAction)
            if req.drainTimeoutAction is not None else self.drain_timeout_outcome,
            verify_timeout=req.verifyTimeoutSeconds if req.verifyTimeoutSeconds is not None
            else self.verify_timeout,
        )

    @property
    def unit(self) -> str:
        return self.service_name or f"k0s{self.role}"

    @property
    def has_node(self) -> bool:
        return self.signal_object is SignalObject.NODE
