"""``k0s-fleet agent``: flags override K0S_FLEET_AGENT_* environment settings."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

HELP = "run the node agent (performs this node's in-place k0s upgrades)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag defaults to "not given", so the environment (or the default) applies."""
    S = argparse.SUPPRESS
    a = p.add_argument
    a("--node-name", default=S, help="this node's Node (or ControlNode) name")
    a("--signal-object", choices=["node", "controlnode"], default=S,
      help="object carrying the signal (controlnode: pure k0s controller without a Node)")
    a("--role", default=S, help="k0s role: worker or controller (service k0s<role>)")
    a("--k0s-binary", type=Path, default=S, help="installed k0s binary (/usr/local/bin/k0s)")
    a("--state-dir", type=Path, default=S,
      help="durable intent markers and the host lock (/var/lib/k0s-fleet-agent)")
    a("--restart-strategy", choices=["systemd", "signal", "command"], default=S)
    a("--service-name", default=S, help="systemd unit (default k0s<role>)")
    a("--restart-signal", default=S, help="signal for --restart-strategy=signal (SIGTERM)")
    a("--restart-command", default=S, help="command line for --restart-strategy=command")
    a("--restart-grace", type=float, default=S,
      help="seconds a recorded restart gets to replace the process before re-issuing")
    a("--host-namespace", choices=["auto", "always", "never"], default=S,
      help="run systemctl/commands via nsenter into pid 1's namespaces")
    a("--version-source", choices=["status-socket", "binary"], default=S)
    a("--status-socket", type=_optional_path, default=S,
      help="k0s status socket (/run/k0s/status.sock; '' for none)")
    a("--pid-file", type=Path, default=S, help="k0s pid file (when there is no status socket)")
    a("--download-attempts", type=int, default=S)
    a("--download-stall-timeout", type=float, default=S, help="seconds without data")
    a("--download-timeout", type=float, default=S, help="seconds for the whole download")
    a("--download-backoff-initial", type=float, default=S)
    a("--download-backoff-max", type=float, default=S)
    a("--max-binary-bytes", type=int, default=S)
    a("--allow-unverified", action="store_true", default=S,
      help="accept requests without sha256 when they explicitly allow it")
    a("--file-url-root", dest="file_url_roots", type=Path, action="append", default=S,
      help="directory file: URLs may read from (repeatable; default: none)")
    a("--no-drain", dest="drain", action="store_false", default=S,
      help="cordon only, do not evict pods")
    a("--drain-timeout", type=float, default=S)
    a("--drain-timeout-outcome", choices=["fail", "proceed"], default=S)
    a("--verify-timeout", type=float, default=S)
    a("--verify-stable-seconds", type=float, default=S)
    a("--no-require-node-ready", dest="require_node_ready", action="store_false", default=S)
    a("--rollback-timeout", type=float, default=S)
    a("--kubeconfig", type=Path, default=S, help="kubeconfig file (default: in-cluster)")
    a("--log-level", default=S)
    a("--otlp-endpoint", default=S, help="OTLP/HTTP collector for spans")
    a("--trace-file", type=Path, default=S, help="append spans as JSON lines")


def _optional_path(value: str) -> Path | None:
    return Path(value) if value else None


def run(args: argparse.Namespace) -> int:
    # imported here so that `k0s-fleet --help` stays fast
    import anyio  # noqa: PLC0415

    from fleet.agents.agent import serve  # noqa: PLC0415
    from fleet.agents.settings import AgentSettings  # noqa: PLC0415

    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "func")}
    try:
        settings = AgentSettings(**overrides)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "settings"
            print(f"k0s-fleet agent: {loc}: {err['msg']}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    provider = None
    tracer = None
    if settings.otlp_endpoint or settings.trace_file:
        from fleet.config import TelemetrySettings  # noqa: PLC0415
        from fleet.telemetry import get_tracer, setup_tracing  # noqa: PLC0415

        provider = setup_tracing(
            TelemetrySettings(otlp_endpoint=settings.otlp_endpoint,
                              service_name="k0s-fleet-agent",
                              trace_file=str(settings.trace_file) if settings.trace_file
                              else None),
            resource_attributes={"k8s.node.name": settings.node_name},
        )
        tracer = get_tracer("fleet.agents", provider)
    try:
        anyio.run(serve, settings, tracer)
    except KeyboardInterrupt:
        pass
    except OSError as e:  # unreadable kubeconfig, unwritable state directory, ...
        print(f"k0s-fleet agent: {e}", file=sys.stderr)
        return 1
    finally:
        if provider is not None:
            provider.shutdown()
    return 0
