"""Cluster API runtime extension: in-place k0s upgrades under CAPI's own sequencing.

Public API:

- :func:`serve_configured_extension`: serve per the fleet config (the controller's entry).
- :func:`start_extension_server` / :func:`serve_extension`: the HTTPS endpoint.
- :class:`ExtensionHandlers`, :class:`UpdateMachineService`: what the hooks do.
- :func:`extension_active`: which path (CAPI via this extension, or the standalone
  sequencer) drives a cluster; see ``docs/runtime-extension.md``.
"""

from fleet.config.models import ExtensionMode
from fleet.extension.activation import (
    ExtensionEndpoint,
    extension_active,
    serving_extension_configs,
)
from fleet.extension.handlers import ExtensionHandlers
from fleet.extension.server import (
    ExtensionServer,
    build_app,
    handlers_from_config,
    running_extension_server,
    serve_configured_extension,
    serve_extension,
    start_extension_server,
)
from fleet.extension.update import (
    ClusterSettingsGetter,
    ExtensionDrives,
    UpdateMachineService,
    WorkloadClientGetter,
    extension_drives,
    workload_client_from_registry,
)
from fleet.extension.workload import SecretWorkloadClients

__all__ = [
    "ClusterSettingsGetter",
    "ExtensionDrives",
    "ExtensionEndpoint",
    "ExtensionHandlers",
    "ExtensionMode",
    "ExtensionServer",
    "SecretWorkloadClients",
    "UpdateMachineService",
    "WorkloadClientGetter",
    "build_app",
    "extension_active",
    "extension_drives",
    "handlers_from_config",
    "running_extension_server",
    "serve_configured_extension",
    "serve_extension",
    "serving_extension_configs",
    "start_extension_server",
    "workload_client_from_registry",
]
