"""Mutual exclusion between CAPI's in-place path and the standalone sequencer.

When Cluster API drives a cluster's in-place updates through our runtime extension (see
:func:`fleet.extension.activation.extension_active`), the standalone sequencer must not
also start upgrades there. :class:`ExtensionExclusion` wraps the controller's policy: it
keeps the management cluster's ExtensionConfigs in a watched store and holds every
cluster the extension path owns, then defers to the wrapped policy (waves, windows,
pauses) for the rest. NodePlans already created, by either path, are still carried
through by the NodePlan reconciler; only new starts are held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from fleet.config.models import ExtensionMode, FleetConfig
from fleet.extension.activation import ExtensionEndpoint, extension_active, own_endpoint
from fleet.kube import KubeClient
from fleet.kube.resources import EXTENSION_CONFIGS
from fleet.kube.watch import Reflector, WatchEvent
from fleet.planner.policy import FleetPolicy, Hold
from fleet.planner.writer import EXTENSION_HOLD_REASON, ExtensionDrives
from fleet.world.model import ClusterKey, ObjectRef, Snapshot

log = logging.getLogger(__name__)

HOLD_REASON = EXTENSION_HOLD_REASON
SYNC_REASON = "waiting for the ExtensionConfigs to be read (runtime extension mode auto)"


class ExtensionExclusion:
    """A :class:`~fleet.planner.policy.FleetPolicy`: hold extension-driven clusters, then
    ask ``inner``."""

    def __init__(self, mgmt: KubeClient, config: FleetConfig, inner: FleetPolicy | None, *,
                 endpoint: ExtensionEndpoint | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        self.config = config
        self.inner = inner
        self.endpoint = endpoint if endpoint is not None else own_endpoint(config.extension)
        self.mode = config.extension.mode
        # ExtensionConfigs can only point at us when we serve the hooks at all.
        self.watching = config.extension.enabled and self.mode is ExtensionMode.AUTO
        self._on_change = on_change
        self.reflector = Reflector(mgmt, EXTENSION_CONFIGS, listener=self._changed)

    async def _changed(self, _event: WatchEvent) -> None:
        if self._on_change is not None:
            self._on_change()

    async def run(self) -> None:
        """Keep the ExtensionConfig store current (only needed in mode auto)."""
        if self.watching:
            await self.reflector.run()

    def readiness_problem(self) -> str | None:
        """None once the ExtensionConfig store is synced (or not needed)."""
        if not self.watching or self.reflector.synced.is_set():
            return None
        return "ExtensionConfig cache not synced yet" + (
            f" ({self.reflector.last_error})" if self.reflector.last_error else "")

    @property
    def stopped(self) -> bool:
        return self.inner is not None and self.inner.stopped

    def on_pass(self, snapshot: Snapshot) -> None:
        if self.inner is not None:
            self.inner.on_pass(snapshot)

    @property
    def digest(self) -> Callable[[Snapshot, Mapping[str, str]], Snapshot] | None:
        """The inner policy's: what the controller keeps of another replica's cluster
        (fleet.rollout.policy.RolloutPolicy.digest); this one reads nothing more of it."""
        found: Callable[[Snapshot, Mapping[str, str]], Snapshot] | None = getattr(
            self.inner, "digest", None)
        return found

    def owns(self, namespace: str, name: str) -> bool:
        """True when the extension path drives this cluster."""
        if not self.config.extension.enabled or self.mode is ExtensionMode.NEVER:
            return False
        cluster = {"metadata": {"namespace": namespace, "name": name}}
        return extension_active(cluster, self.reflector.items(), self.mode,
                                endpoint=self.endpoint)

    async def __call__(self, snapshot: Snapshot) -> Hold | None:
        inner_hold = await self.inner(snapshot) if self.inner is not None else None
        if not self.config.extension.enabled or self.mode is ExtensionMode.NEVER:
            return inner_hold
        synced = not self.watching or self.reflector.synced.is_set()

        def hold(cluster: ClusterKey, owner: ObjectRef) -> str | None:
            if not synced:
                return SYNC_REASON
            namespace, name = cluster
            inner = inner_hold(cluster, owner) if inner_hold is not None else None
            if self.owns(namespace, name):
                # The planner starts no worker here; under a FleetUpgrade it still writes
                # the versions, as far as the rollout policy (``inner``) admits.
                return ExtensionDrives(HOLD_REASON, inner)
            return inner

        return hold
