"""ExtensionExclusion: which clusters the standalone sequencer leaves to CAPI."""

from __future__ import annotations

from typing import Any, cast

import pytest

from fleet.config import FleetConfig
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
