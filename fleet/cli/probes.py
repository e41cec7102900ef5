"""The controller process's /healthz and /readyz checks (fleet.status.health), wired to
its parts: the fleet controller (runs while this replica leads), the ExtensionConfig
watch (every replica, mode auto) and the runtime extension's HTTPS server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleet.config.models import FleetConfig
from fleet.status.health import Health


class _Controller(Protocol):
    def readiness_problem(self) -> str | None: ...
    def liveness_problem(self) -> str | None: ...


class _Exclusion(Protocol):
    def readiness_problem(self) -> str | None: ...


@dataclass
class ControllerProbes:
    health: Health = field(default_factory=Health)
    extension_enabled: bool = False
    extension_up: bool = False

    def extension_serving(self) -> None:
        """Called by the extension server once its certificate is loaded and it listens."""
        self.extension_up = True

    def _extension(self) -> str | None:
        if not self.extension_enabled or self.extension_up:
            return None
        return "runtime extension not serving yet (certificate not loaded)"


def probes(controller: _Controller, exclusion: _Exclusion, config: FleetConfig
           ) -> ControllerProbes:
    p = ControllerProbes(extension_enabled=config.extension.enabled)
    p.health.live.add("controller", controller.liveness_problem)
    p.health.ready.add("controller", controller.readiness_problem)
    p.health.ready.add("extension-configs", exclusion.readiness_problem)
    p.health.ready.add("extension", p._extension)
    return p


__all__ = ["ControllerProbes", "probes"]
