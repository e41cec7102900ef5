"""ExtensionExclusion: which clusters the standalone sequencer leaves to CAPI."""

from __future__ import annotations

from typing import Any, cast

import pytest

from fleet.config.models import FleetConfig
from fleet.extension.exclusion import HOLD_REASON, SYNC_REASON, ExtensionExclusion
from fleet.kube import KubeClient

pytestmark = pytest.mark.anyio

NO_CLIENT = cast(KubeClient, None)  # nothing here performs I/O


def config(mode: str, enabled: bool = True) -> FleetConfig:
    ext: dict[str, Any] = {"enabled": enabled, "mode": mode}
    if enabled:
        ext |= {"certFile": "/tls/tls.crt", "keyFile": "/tls/tls.key"}
    return FleetConfig.model_validate({"extension": ext})


def registered(namespace: str, name: str = "k0s-fleet") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"clientConfig": {"url": "https://ext.example:9443"},
                 "namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": namespace}}},
        "status": {"handlers": [{"name": f"update-machine.{name}",
                                 "requestHook": {"hook": "UpdateMachine", "apiVersion":
                                                 "hooks.runtime.cluster.x-k8s.io/v1alpha1"}}]},
    }


async def inner_pauses_b(_snapshot: Any) -> Any:
    return lambda cluster, owner: "paused" if cluster == ("ns", "b") else None


async def test_disabled_extension_defers_to_the_inner_policy() -> None:
    ex = ExtensionExclusion(NO_CLIENT, config("auto", enabled=False), inner_pauses_b)
    hold = await ex(None)
    assert hold is not None
    assert hold(("ns", "a"), None) is None
    assert hold(("ns", "b"), None) == "paused"
    assert not ex.watching


async def test_mode_always_holds_every_cluster() -> None:
    ex = ExtensionExclusion(NO_CLIENT, config("always"), None)
    hold = await ex(None)
    assert hold is not None and hold(("ns", "a"), None) == HOLD_REASON


async def test_mode_never_holds_nothing() -> None:
    ex = ExtensionExclusion(NO_CLIENT, config("never"), None)
    assert await ex(None) is None


async def test_auto_holds_everything_until_synced_then_only_registered_namespaces() -> None:
    ex = ExtensionExclusion(NO_CLIENT, config("auto"), inner_pauses_b)
    assert ex.watching
    hold = await ex(None)
    assert hold is not None and hold(("ns", "a"), None) == SYNC_REASON
    ex.reflector.store = {("", "k0s-fleet"): registered("capi")}
    ex.reflector.synced.set()
    hold = await ex(None)
    assert hold is not None
    assert hold(("capi", "x"), None) == HOLD_REASON
    assert hold(("ns", "a"), None) is None
    assert hold(("ns", "b"), None) == "paused"


async def test_stopped_follows_the_inner_policy() -> None:
    class Stopped:
        stopped = True

        async def __call__(self, _snapshot: Any) -> None:
            return None

    assert ExtensionExclusion(NO_CLIENT, config("never"), Stopped()).stopped
    assert not ExtensionExclusion(NO_CLIENT, config("never"), None).stopped


def by_service(namespace: str, name: str, service: str, service_ns: str) -> dict[str, Any]:
    obj = registered(namespace, name)
    obj["spec"]["clientConfig"] = {"service": {"name": service, "namespace": service_ns,
                                               "port": 443}}
    return obj


async def test_only_our_own_extension_config_counts_once_our_service_is_configured() -> None:
    """k0smotron's ExtensionConfig registers the same hook names; with the Service the chart
    configures (extension.serviceName/serviceNamespace) only ours hands a cluster to CAPI."""
    k0smotron = by_service("km", "inplace-version-update-extensionconfig",
                           "k0smotron-extension", "k0smotron")
    ours = by_service("capi", "k0s-fleet", "k0s-fleet-extension", "k0s-fleet-system")
    cfg = FleetConfig.model_validate({"extension": {
        "enabled": True, "mode": "auto", "certFile": "/tls/tls.crt", "keyFile": "/tls/tls.key",
        "serviceName": "k0s-fleet-extension", "serviceNamespace": "k0s-fleet-system"}})
    ex = ExtensionExclusion(NO_CLIENT, cfg, None)
    ex.reflector.store = {("", "km"): k0smotron, ("", "ours"): ours}
    ex.reflector.synced.set()
    hold = await ex(None)
    assert hold is not None
    assert hold(("capi", "x"), None) == HOLD_REASON
    assert hold(("km", "x"), None) is None  # k0smotron's extension, not ours
    # Without a configured endpoint (old configurations) any registration counts.
    legacy = ExtensionExclusion(NO_CLIENT, config("auto"), None)
    legacy.reflector.store = dict(ex.reflector.store)
    legacy.reflector.synced.set()
    hold = await legacy(None)
    assert hold is not None and hold(("km", "x"), None) == HOLD_REASON


@pytest.mark.parametrize(("ext", "problem"), [
    ({"serviceName": "svc"}, "serviceName and serviceNamespace go together"),
    ({"serviceNamespace": "ns"}, "serviceName and serviceNamespace go together"),
    ({"url": "http://ext.example:9443/hooks"}, "must be an https URL"),
    ({"serviceName": "Not_A_Label", "serviceNamespace": "ns"}, "not a valid DNS label"),
])
async def test_extension_endpoint_settings_are_checked(ext: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        FleetConfig.model_validate({"extension": {"mode": "never", **ext}})
