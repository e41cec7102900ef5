"""Observe: watches on the management cluster (the snapshot the planner decides on is
built from them per cluster by :mod:`fleet.controllers.parts`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable

import anyio
import anyio.abc

from fleet.config.models import FleetConfig
from fleet.kube import KubeClient, KubeError, NotFoundError
from fleet.kube.backoff import Backoff
from fleet.kube.cache import ObjectCache, ObjectListener
from fleet.kube.resources import (
    CLUSTERS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_DRAIN_RULES,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    SECRETS,
    Resource,
)
from fleet.kube.watch import Reflector
from fleet.world.kept import FOREIGN_ZDICT, foreign, projection
from fleet.world.model import (
    ClusterKey,
)

log = logging.getLogger(__name__)

WATCHED = (CLUSTERS, MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES, K0S_CONTROL_PLANES,
           NODE_PLANS, SECRETS)
# Watched where their CRD is served (k0smotron's bootstrap provider may not be installed,
# nor its hosted control planes; Cluster API serves MachineDrainRule v1beta2 from v1.11).
OPTIONAL = (K0S_WORKER_CONFIG_TEMPLATES, K0SMOTRON_CONTROL_PLANES, MACHINE_DRAIN_RULES)
# Only CAPI's kubeconfig Secrets are cached (never every Secret of the namespace).
CAPI_SECRET_TYPE = "cluster.x-k8s.io/secret"
SECRET_FIELD_SELECTOR = f"type={CAPI_SECRET_TYPE}"


class ManagementView:
    """Caches of the management cluster's objects, kept current by Reflectors."""

    def __init__(self, client: KubeClient, *, namespaces: Iterable[str] = (),
                 on_change: Callable[[], None] | None = None, watch_timeout: int = 120,
                 intent_namespace: str | None = None,
                 extra_secrets: Iterable[tuple[str, str]] = (),
                 on_object: Callable[[Resource], ObjectListener] | None = None,
                 holds: Callable[[ClusterKey], bool] | None = None) -> None:
        self.client = client
        self.namespaces: list[str | None] = list(namespaces) or [None]
        # FleetUpgrades live in the controller's own namespace (management.namespace).
        self.intent_namespace = intent_namespace
        # ``on_object(res)``: a listener told which object of ``res`` changed. Of the
        # CAPI objects and kubeconfig Secrets only what the controller reads is kept
        # (fleet/world/kept.py); the watches keep no copy of their own (keep_objects=False).
        # ``holds`` (sharded replicas): whether this replica holds a cluster; of the others'
        # Machines and kubeconfig Secrets less is kept (fleet/world/kept.py FOREIGN_SPECS).
        self.holds = holds
        self.caches = {res: ObjectCache(res.kind, on_change=on_change,
                                        on_object=on_object(res) if on_object else None,
                                        keep=projection(res, holds),
                                        foreign=foreign(res, holds), zdict=FOREIGN_ZDICT)
                       for res in (*WATCHED, *OPTIONAL, FLEET_UPGRADES)}
        self.reflectors: list[Reflector] = []
        self.watch_timeout = watch_timeout
        # Kubeconfig Secrets named in the config (clusters.entries[].kubeconfigSecret):
        # they need not carry Cluster API's Secret type, so each gets its own watch.
        self.extra_secrets = sorted(set(extra_secrets))

    def __getitem__(self, res: Resource) -> ObjectCache:
        return self.caches[res]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        async with anyio.create_task_group() as tg:
            for res in WATCHED:
                for ns in self.namespaces:
                    cache = self.caches[res]
                    r = Reflector(
                        self.client, res, namespace=ns, sink=cache.take_event,
                        field_selector=SECRET_FIELD_SELECTOR if res is SECRETS else None,
                        watch_timeout=self.watch_timeout, keep_objects=False,
                        # the cache's versions, not a copy (Secrets have other feeders)
                        versions=None if res is SECRETS else functools.partial(
                            cache.versions, ns))
                    self.reflectors.append(r)
                    tg.start_soon(r.run)
            if self.intent_namespace is not None:
                r = Reflector(self.client, FLEET_UPGRADES, namespace=self.intent_namespace,
                              sink=self.caches[FLEET_UPGRADES].take_event,
                              watch_timeout=self.watch_timeout, keep_objects=False)
                self.reflectors.append(r)
                tg.start_soon(r.run)
            for ns, name in self.extra_secrets:
                r = Reflector(self.client, SECRETS, namespace=ns,
                              sink=self.caches[SECRETS].take_event,
                              field_selector=f"metadata.name={name}",
                              watch_timeout=self.watch_timeout, keep_objects=False)
                self.reflectors.append(r)
                tg.start_soon(r.run)
            for res in OPTIONAL:
                if await self._served(res):
                    self._watch(tg, res)
                else:
                    tg.start_soon(self._watch_when_served, tg, res)
            for r in self.reflectors:
                await r.synced.wait()
            for cache in self.caches.values():
                cache.mark_synced()
            task_status.started()

    def _watch(self, tg: anyio.abc.TaskGroup, res: Resource) -> None:
        for ns in self.namespaces:
            r = Reflector(self.client, res, namespace=ns, sink=self.caches[res].take_event,
                          watch_timeout=self.watch_timeout, keep_objects=False)
            self.reflectors.append(r)
            tg.start_soon(r.run)

    async def _served(self, res: Resource) -> bool:
        try:
            await self.client.list(res, self.namespaces[0])
        except NotFoundError:
            return False
        except KubeError as e:
            log.warning("cannot tell whether %s are served (looking again): %s", res.kind, e)
            return False
        return True

    async def _watch_when_served(self, tg: anyio.abc.TaskGroup, res: Resource) -> None:
        """Until its CRD is served the cache stays empty (and synced); looked for again with
        backoff, then watched like the rest."""
        log.info("%s are not served: looking again later", res.kind)
        backoff = Backoff(initial=5.0, maximum=300.0)
        while True:
            await anyio.sleep(backoff.next_delay())
            if await self._served(res):
                log.info("%s are served now: watching them", res.kind)
                self._watch(tg, res)
                return

    @property
    def requests(self) -> int:
        """List requests made by the watches (relists), for the benchmarks."""
        return sum(r.relists for r in self.reflectors)


def kubeconfig_secrets(config: FleetConfig, clusters: Iterable[ClusterKey]
                       ) -> dict[ClusterKey, str]:
    return {key: config.for_cluster(key[0], key[1]).kubeconfig_secret for key in clusters}
