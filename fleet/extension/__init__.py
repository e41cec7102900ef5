"""Cluster API runtime extension: in-place k0s upgrades under CAPI's own sequencing.

Public API:

- :func:`start_extension_server` / :func:`serve_extension`: the HTTPS endpoint.
- :class:`ExtensionHandlers`, :class:`UpdateMachineService`: what the hooks do.
- :func:`extension_active`: which path (CAPI via this extension, or the standalone
  sequencer) drives a cluster; see ``docs/runtime-extension.md``.
"""

from fleet.config import ExtensionMode
from fleet.extension.activation import (
    ExtensionEndpoint,
    extension_active,
    selector_matches,
    serving_extension_configs,
)
from fleet.extension.handlers import ExtensionHandlers
from fleet.extension.server import (
    ExtensionServer,
    build_app,
    running_extension_server,
    serve_extension,
    start_extension_server,
)
from fleet.extension.update import (
    Artifact,
    ArtifactError,
    ArtifactRequest,
    ArtifactResolver,
    ConfigArtifacts,
    ManifestFetcher,
    UpdateMachineService,
    WorkloadClientGetter,
)

__all__ = [
    "Artifact",
    "ArtifactError",
    "ArtifactRequest",
    "ArtifactResolver",
    "ConfigArtifacts",
    "ExtensionEndpoint",
    "ExtensionHandlers",
    "ExtensionMode",
    "ExtensionServer",
    "ManifestFetcher",
    "UpdateMachineService",
    "WorkloadClientGetter",
    "build_app",
    "extension_active",
    "running_extension_server",
    "selector_matches",
    "serve_extension",
    "serving_extension_configs",
    "start_extension_server",
]
