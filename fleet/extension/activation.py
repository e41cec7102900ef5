"""Who upgrades a cluster's Machines: CAPI through this extension, or the standalone sequencer.

Exactly one path may drive a cluster, otherwise both would dispatch and count
unavailability separately. The rule (``extension.mode`` in the fleet config):

- ``never``: the standalone sequencer, always. The extension (if served at all)
  declines every CanUpdate call, so CAPI does its ordinary rollout.
- ``always``: the extension, always; the standalone sequencer leaves every cluster's
  Machines to CAPI.
- ``auto`` (default): the extension for a cluster exactly when an ``ExtensionConfig``
  exists that

  1. points at this extension (``spec.clientConfig.service`` names our Service, or
     ``spec.clientConfig.url`` our URL; without a known endpoint, any), and
  2. CAPI has discovered with our UpdateMachine handler (``status.handlers`` lists
     ``update-machine.<ExtensionConfig name>`` for hook ``UpdateMachine``): only then
     will CAPI call us, and
  3. selects the cluster's namespace (``spec.namespaceSelector``; empty selects all).

  Otherwise the standalone sequencer.

Both sides evaluate the same pure function on the same objects, so they agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fleet.config.models import ExtensionMode, ExtensionSettings
from fleet.contract.selectors import selector_matches
from fleet.extension.catalog import HANDLER_BY_HOOK
from fleet.extension.wire import HOOKS_API_VERSION, Hook

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True, slots=True)
class ExtensionEndpoint:
    """How an ExtensionConfig reaches this extension: our Service, or our URL."""

    service_name: str | None = None
    service_namespace: str | None = None
    url: str | None = None

    def matches(self, client_config: Mapping[str, Any]) -> bool:
        service = client_config.get("service") or {}
        if isinstance(service, Mapping) and service.get("name"):
            return bool(self.service_name) and service.get("name") == self.service_name \
                and service.get("namespace") == self.service_namespace
        url = client_config.get("url")
        if isinstance(url, str) and url and self.url:
            a, b = urlsplit(url), urlsplit(self.url)
            return (a.hostname, a.port or 443) == (b.hostname, b.port or 443) \
                and a.path.rstrip("/") == b.path.rstrip("/")
        return False


def own_endpoint(settings: ExtensionSettings) -> ExtensionEndpoint | None:
    """k0s-fleet's own endpoint as configured (extension.serviceName/serviceNamespace or
    extension.url; the chart sets the Service); None when neither is configured, in which
    case any ExtensionConfig registering the hooks is taken for ours."""
    if not (settings.service_name or settings.url):
        return None
    return ExtensionEndpoint(service_name=settings.service_name,
                             service_namespace=settings.service_namespace, url=settings.url)


def registers_update_machine(extension_config: Mapping[str, Any]) -> bool:
    """CAPI discovered our UpdateMachine handler behind this ExtensionConfig."""
    name = (extension_config.get("metadata") or {}).get("name") or ""
    ours = f"{HANDLER_BY_HOOK[Hook.UPDATE_MACHINE].name}.{name}"
    for h in (extension_config.get("status") or {}).get("handlers") or []:
        if not isinstance(h, Mapping):
            continue
        hook = h.get("requestHook") or {}
        if h.get("name") == ours and hook.get("hook") == str(Hook.UPDATE_MACHINE) \
                and hook.get("apiVersion") == HOOKS_API_VERSION:
            return True
    return False


def serving_extension_configs(
    cluster: Mapping[str, Any], extension_configs: Iterable[Mapping[str, Any]], *,
    namespace_labels: Mapping[str, str] | None = None,
    endpoint: ExtensionEndpoint | None = None,
) -> list[Mapping[str, Any]]:
    """The ExtensionConfigs through which CAPI will call us for this cluster's Machines."""
    namespace = (cluster.get("metadata") or {}).get("namespace") or ""
    labels = dict(namespace_labels) if namespace_labels is not None else {}
    labels.setdefault(NAMESPACE_NAME_LABEL, namespace)  # the API server always sets it
    out = []
    for ec in extension_configs:
        spec = ec.get("spec") or {}
        client_config = spec.get("clientConfig") or {}
        if endpoint is not None and not endpoint.matches(client_config):
            continue
        if not registers_update_machine(ec):
            continue
        if not selector_matches(spec.get("namespaceSelector"), labels):
            continue
        out.append(ec)
    return out


def extension_active(
    cluster: Mapping[str, Any], extension_configs: Iterable[Mapping[str, Any]],
    mode: ExtensionMode | str, *, namespace_labels: Mapping[str, str] | None = None,
    endpoint: ExtensionEndpoint | None = None,
) -> bool:
    """True when CAPI drives this cluster's in-place updates through this extension.

    ``cluster``: the CAPI Cluster object (its namespace is what CAPI's namespaceSelector
    is matched against). ``extension_configs``: the ExtensionConfig objects of the
    management cluster. ``namespace_labels``: the labels of the cluster's Namespace
    (default: only ``kubernetes.io/metadata.name``). ``endpoint``: how ExtensionConfigs
    refer to us; None accepts any ExtensionConfig that registered our handler names.
    """
    m = ExtensionMode(mode)
    if m is ExtensionMode.NEVER:
        return False
    if m is ExtensionMode.ALWAYS:
        return True
    return bool(serving_extension_configs(cluster, extension_configs,
                                          namespace_labels=namespace_labels,
                                          endpoint=endpoint))
