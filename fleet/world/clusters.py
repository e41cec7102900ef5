"""Workload clusters: one client and one set of watches per cluster, built from CAPI's
``<cluster>-kubeconfig`` Secret (key ``value``) and rebuilt whenever that Secret changes.

The controller says which clusters it wants and under which Secret name
(:meth:`ClusterRegistry.want`); the registry watches those clusters' Nodes, autopilot
ControlNodes and autopilot Plans and reports every change through ``on_change``; a
cluster any of whose watches has failed for a bound is unreachable. A rotated Secret (new
token, new CA, new server) replaces the client and its watches; a cluster no longer
wanted is closed. Clients are created inside the running event loop and always closed.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import yaml

from fleet.kube import KubeClient, KubeError, KubeObject, NotFoundError
from fleet.kube.backoff import Backoff
from fleet.kube.cache import ObjectCache, RecordCache, Remembered
from fleet.kube.inline import check_inline
from fleet.kube.resources import AUTOPILOT_PLANS, CONTROL_NODES, NODES, SECRETS, Resource
from fleet.kube.watch import Reflector, crd_established
from fleet.world.model import KIND_CONTROL_NODE, KIND_NODE, ClusterKey
from fleet.world.records import (
    NodeRecord,
    PlanRecord,
    node_record,
    node_subset,
    plan_record,
    plan_subset,
)

log = logging.getLogger(__name__)

KUBECONFIG_KEY = "value"
# libyaml's safe loader where PyYAML has it: a thousand kubeconfigs read at start-up cost
# about a tenth of the pure-Python loader's CPU.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

ClientFactory = Callable[[Mapping[str, Any], str], Awaitable[KubeClient]]


class KubeconfigSecretError(ValueError):
    """The Secret exists but holds no usable kubeconfig."""


def _node_record_of(obj: KubeObject) -> NodeRecord:
    return node_record(obj, KIND_NODE)


def _control_node_record_of(obj: KubeObject) -> NodeRecord:
    return node_record(obj, KIND_CONTROL_NODE)


# Shared by every workload cluster's cache: clusters whose workload clusters share Nodes
# (one API server behind many Cluster API clusters) are handed the same decoded watch
# event, and share its record (fleet.kube.cache.Remembered).
_node_record = Remembered(_node_record_of)
_control_node_record = Remembered(_control_node_record_of)
_plan_record = Remembered(plan_record)


def node_cache(on_change: Callable[[], None] | None = None) -> RecordCache[NodeRecord]:
    return RecordCache("Node", _node_record, on_change=on_change)


def control_node_cache(on_change: Callable[[], None] | None = None
                       ) -> RecordCache[NodeRecord]:
    return RecordCache("ControlNode", _control_node_record, on_change=on_change)


def plan_cache(on_change: Callable[[], None] | None = None) -> RecordCache[PlanRecord]:
    return RecordCache("Plan", _plan_record, on_change=on_change)


def kubeconfig_from_secret(secret: KubeObject, *, allow_files: bool = False) -> dict[str, Any]:
    """The kubeconfig in ``data.value`` (base64) or ``stringData.value``, with inline
    credentials only (:mod:`fleet.kube.inline`; ``allow_files``: the operator allows file
    paths in the Secret's namespace), else
    :class:`~fleet.kube.inline.KubeconfigNotAllowedError` naming the Secret and the field."""
    name = f"{(secret.get('metadata') or {}).get('namespace')}/" \
           f"{(secret.get('metadata') or {}).get('name')}"
    raw: str | None = None
    data = secret.get("data") or {}
    if KUBECONFIG_KEY in data:
        try:
            raw = base64.b64decode(data[KUBECONFIG_KEY]).decode("utf-8")
        except (ValueError, UnicodeDecodeError) as e:
            raise KubeconfigSecretError(f"Secret {name}: key {KUBECONFIG_KEY!r} is not "
                                        f"base64 text: {e}") from None
    elif KUBECONFIG_KEY in (secret.get("stringData") or {}):
        raw = str(secret["stringData"][KUBECONFIG_KEY])
    if raw is None:
        raise KubeconfigSecretError(f"Secret {name} has no key {KUBECONFIG_KEY!r}")
    try:
        config = yaml.load(raw, Loader=_YAML_LOADER)  # a safe loader (see above)
    except yaml.YAMLError as e:
        raise KubeconfigSecretError(f"Secret {name}: {KUBECONFIG_KEY!r} is not YAML: "
                                    f"{e}") from None
    if not isinstance(config, dict) or not config.get("clusters"):
        raise KubeconfigSecretError(f"Secret {name}: {KUBECONFIG_KEY!r} is not a kubeconfig")
    check_inline(config, what=f"kubeconfig Secret {name}", allow_files=allow_files)
    return config


def secret_digest(secret: KubeObject | None) -> str:
    """What identifies the kubeconfig a Secret holds: the same whether its value is in
    ``data`` (base64) or, decoded, in ``stringData`` (as the controller's cache keeps it)."""
    if secret is None:
        return ""
    value = (secret.get("data") or {}).get(KUBECONFIG_KEY)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):  # (UnicodeDecodeError is a ValueError)
            value = base64.b64decode(value, validate=True).decode("utf-8")
    else:
        value = value or (secret.get("stringData") or {}).get(KUBECONFIG_KEY) or ""
    return hashlib.sha256(str(value).encode()).hexdigest()[:16]


async def _default_factory(kubeconfig: Mapping[str, Any], name: str, *,
                           allow_files: bool = False) -> KubeClient:
    return await KubeClient.for_many(kubeconfig, name=name, allow_files=allow_files)


def no_file_credentials(namespace: str) -> bool:
    """The default kubeconfig Secret policy: no namespace may use file paths."""
    return False


@dataclass
class WorkloadCluster:
    """The live connection to one workload cluster. Its caches hold compact records
    (:mod:`fleet.world.records`), never the objects' full JSON."""

    key: ClusterKey
    secret_name: str
    digest: str
    nodes: RecordCache[NodeRecord] = field(default_factory=node_cache)
    control_nodes: RecordCache[NodeRecord] = field(default_factory=control_node_cache)
    client: KubeClient | None = None
    # autopilot Plans: another driver of this cluster's k0s versions (k0smotron, a user)
    plans: RecordCache[PlanRecord] = field(default_factory=plan_cache)
    error: str | None = None
    # when the Secret's kubeconfig was found unusable (refused, unreadable): from then on
    # the cluster is unreachable, with ``error`` as the reason (no client to wait for)
    unusable_since: datetime | None = None
    generation: int = 0  # bumped on every rebuild (a rotated Secret)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    # the resourceVersion of the Secret ``digest`` was taken from (None: not held)
    secret_rv: str | None = None
    node_reflector: Reflector | None = None
    # ControlNodes and autopilot Plans (where served): kind -> its reflector once the
    # resource was found, and kind -> its failing search for the resource before that.
    optional_reflectors: dict[str, Reflector] = field(default_factory=dict)
    optional_probes: dict[str, WatchHealth] = field(default_factory=dict)
    # when this process began watching the cluster (wall clock; ClusterInfo.acting_since)
    watching_since: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def name(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"

    @property
    def observed(self) -> bool:
        """Nodes are known (listed at least once since this client was built)."""
        return self.client is not None and self.nodes.synced

    def unreachable(self, after: float, now: float | None = None
                    ) -> tuple[datetime, str] | None:
        """(since when, last error) when one of this cluster's watches (Nodes, and
        ControlNodes / autopilot Plans where served) has failed without a single success
        for ``after`` seconds or more; None while they answer (or before that bound: one
        dropped watch is not an outage). A cluster whose Nodes answer but whose
        ControlNodes do not is no healthier for control-plane decisions (and one whose
        autopilot Plans do not might be driven by someone else unseen)."""
        if self.unusable_since is not None:
            return self.unusable_since, self.error or "kubeconfig unusable"
        now = time.monotonic() if now is None else now
        worst: tuple[float, datetime, str] | None = None
        for what, h in self._health():
            if h.failing_since is None or h.failing_since_wall is None:
                continue
            if now - h.failing_since < after:
                continue
            error = h.last_error or "no answer"
            if what != NODES.kind:
                error = f"{what} watch: {error}"
            if worst is None or h.failing_since < worst[0]:
                worst = (h.failing_since, h.failing_since_wall, error)
        return None if worst is None else (worst[1], worst[2])

    def _health(self) -> list[tuple[str, Reflector | WatchHealth]]:
        out: list[tuple[str, Reflector | WatchHealth]] = []
        if self.node_reflector is not None:
            out.append((NODES.kind, self.node_reflector))
        out += sorted(self.optional_probes.items())
        out += sorted(self.optional_reflectors.items())
        return out


@dataclass
class WatchHealth:
    """Whether requests for one resource fail, and since when (as a Reflector tracks
    its list/watch requests)."""

    failing_since: float | None = None  # monotonic
    failing_since_wall: datetime | None = None
    last_error: str | None = None

    def failed(self, error: Exception) -> None:
        if self.failing_since is None:
            self.failing_since, self.failing_since_wall = time.monotonic(), datetime.now(UTC)
        self.last_error = str(error) or type(error).__name__

    def succeeded(self) -> None:
        self.failing_since, self.failing_since_wall, self.last_error = None, None, None


# Seconds a workload watch asks the server to keep it open (less up to half, at random).
WORKLOAD_WATCH_TIMEOUT = 1800


class ClusterRegistry:
    """Workload cluster clients keyed by CAPI Cluster, following their kubeconfig Secrets."""

    # How many workload lists are read and converted at once: a start-up of a thousand
    # clusters then peaks at a few clusters' full JSON rather than all of it (memory a
    # process seldom gives back to the system once it has it).
    relist_concurrency = 32

    def __init__(self, secrets: ObjectCache, *, on_change: Callable[[], None],
                 on_cluster: Callable[[ClusterKey], None] | None = None,
                 client_factory: ClientFactory | None = None,
                 watch_timeout: int = WORKLOAD_WATCH_TIMEOUT, idle_timeout: float = 150.0,
                 unreachable_after: float = 30.0,
                 write_fence: Callable[[], bool] | None = None,
                 allow_file_credentials: Callable[[str], bool] = no_file_credentials) -> None:
        self.secrets = secrets
        # The operator's allowance (clusters.kubeconfigSecrets.allowFileCredentials):
        # whether a kubeconfig Secret in this namespace may name files. Nothing else
        # beyond inline credentials is ever allowed (fleet.kube.inline).
        self.allow_file_credentials = allow_file_credentials
        # The controller's Lease fence (KubeClient.fenced) for its workload writes too.
        self.write_fence = write_fence
        # A cluster whose watches have failed this long is unreachable: its last cache
        # is not decided on, nothing new starts there (docs/controller.md).
        self.unreachable_after = unreachable_after
        self.on_change = on_change
        # Told which cluster moved (its Nodes, ControlNodes, Plans, connection or health),
        # before ``on_change``: the controller re-plans just that cluster.
        self.on_cluster = on_cluster
        self.client_factory = client_factory
        # Workload watches (a few per cluster, thousands of clusters) are long: the server
        # ends each after watch_timeout less up to half of it (at random, so that a fleet
        # started at once does not re-open at once), and it resumes from the last
        # resourceVersion or bookmark: one request per watch per ~20 min, never a list.
        # idle_timeout bounds how long a dead connection goes unnoticed (bookmarks arrive
        # about every minute; a watch silent past it is resumed, see Reflector).
        self.watch_timeout = watch_timeout
        self.idle_timeout = idle_timeout
        self.clusters: dict[ClusterKey, WorkloadCluster] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.rebuilds = 0
        self._relists: anyio.CapacityLimiter | None = None

    def get(self, key: ClusterKey) -> WorkloadCluster | None:
        return self.clusters.get(key)

    def unreachable(self, key: ClusterKey) -> tuple[datetime, str] | None:
        wc = self.clusters.get(key)
        return None if wc is None else wc.unreachable(self.unreachable_after)

    def client(self, key: ClusterKey) -> KubeClient | None:
        wc = self.clusters.get(key)
        return None if wc is None else wc.client

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Own the workload watches until cancelled; then close every client."""
        self._relists = anyio.CapacityLimiter(self.relist_concurrency)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            for wc in list(self.clusters.values()):
                wc.scope.cancel()
            with anyio.CancelScope(shield=True):
                for wc in list(self.clusters.values()):
                    await self._close(wc)
            self.clusters.clear()

    def changed(self, key: ClusterKey) -> None:
        if self.on_cluster is not None:
            self.on_cluster(key)
        self.on_change()

    def settled(self, key: ClusterKey) -> bool:
        """Whether what the controller knows of this cluster's nodes is an answer: its
        Nodes, and its ControlNodes and autopilot Plans (or that they are not served),
        listed since its client was built; or no client can be built (no usable
        kubeconfig), or unreachable for the registry's bound. A restarted controller
        decides nothing on a cluster before that (it would write "unreachable", or a k0s
        controller without a kubelet as missing, then write it back)."""
        wc = self.clusters.get(key)
        if wc is None:
            return False
        return (wc.observed and wc.control_nodes.synced and wc.plans.synced) or \
            wc.error is not None or self.unreachable(key) is not None

    def waiting_for(self, key: ClusterKey) -> str:
        """What :meth:`settled` still waits for on this cluster, in words (for logs)."""
        wc = self.clusters.get(key)
        if wc is None:
            return "no client asked for"
        if wc.client is None:
            return "client being built"
        parts = [name for name, done in (("Nodes", wc.nodes.synced),
                                         ("ControlNodes", wc.control_nodes.synced),
                                         ("autopilot Plans", wc.plans.synced)) if not done]
        return "not yet listed: " + ", ".join(parts) if parts else "answered"

    def want(self, wanted: Mapping[ClusterKey, str]) -> None:
        """Make the set of connections match ``wanted`` (cluster -> kubeconfig Secret name).

        Cheap when nothing changed: called on every planning pass.
        """
        if self._tg is None:
            return
        for key in list(self.clusters):
            if key not in wanted:
                log.info("workload cluster %s/%s no longer wanted; closing", *key)
                self._drop(key)
        for key, secret_name in wanted.items():
            wc = self.clusters.get(key)
            rv = self.secrets.resource_version(secret_name, key[0])
            if wc is not None and wc.secret_name == secret_name and rv and rv == wc.secret_rv:
                continue  # the Secret this client was built from (not read again)
            secret = self.secrets.get(secret_name, key[0])
            digest = secret_digest(secret)
            if wc is not None and wc.digest == digest and wc.secret_name == secret_name:
                wc.secret_rv = rv
                continue
            if wc is not None:
                log.info("kubeconfig Secret %s/%s of cluster %s changed; reconnecting",
                         key[0], secret_name, key[1])
                self._drop(key)
            self._start(key, secret_name, secret, digest)

    def connect(self, key: ClusterKey, secret_name: str) -> None:
        """Start one cluster's client and watches now, if it has none from this Secret,
        without touching the others (:meth:`want` makes the whole set match and is what
        later keeps or drops it): a shard's cluster being taken over is connected while
        the rest of its warm-up reads, not after."""
        if self._tg is None:
            return
        wc = self.clusters.get(key)
        if wc is not None and wc.secret_name == secret_name:
            return  # want() follows a change of that Secret
        secret = self.secrets.get(secret_name, key[0])
        digest = secret_digest(secret)
        if not digest:
            return  # no kubeconfig there (yet): want() says so once the cluster is acted on
        if wc is not None:
            self._drop(key)
        self._start(key, secret_name, secret, digest)

    def _drop(self, key: ClusterKey) -> None:
        wc = self.clusters.pop(key)
        wc.scope.cancel()
        self.changed(key)

    def _start(self, key: ClusterKey, secret_name: str, secret: KubeObject | None,
               digest: str) -> None:
        assert self._tg is not None
        moved = functools.partial(self.changed, key)
        wc = WorkloadCluster(key=key, secret_name=secret_name, digest=digest,
                             secret_rv=self.secrets.resource_version(secret_name, key[0]),
                             nodes=node_cache(moved),
                             control_nodes=control_node_cache(moved),
                             plans=plan_cache(moved))
        self.clusters[key] = wc
        self.rebuilds += 1
        if secret is None:
            wc.error = f"kubeconfig Secret {key[0]}/{secret_name} not found"
            self.changed(key)
            return
        self._tg.start_soon(self._connect, wc, secret)

    async def _connect(self, wc: WorkloadCluster, secret: KubeObject) -> None:
        with wc.scope:
            try:
                try:
                    files = self.allow_file_credentials(wc.key[0])
                    kubeconfig = kubeconfig_from_secret(secret, allow_files=files)
                    factory = self.client_factory or functools.partial(
                        _default_factory, allow_files=files)
                    client = await factory(kubeconfig, f"workload:{wc.name}")
                    wc.client = client if self.write_fence is None else \
                        client.fenced(self.write_fence)
                except (KubeconfigSecretError, KubeError, ValueError, OSError) as e:
                    # No client from this Secret: the cluster is unreachable (nothing is
                    # dispatched to it) and says why until the Secret changes.
                    wc.error = str(e)
                    wc.unusable_since = datetime.now(UTC)
                    log.warning("workload cluster %s: %s", wc.name, e)
                    self.changed(wc.key)
                    return
                wc.error = None
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch_nodes, wc)
                    tg.start_soon(self._watch_optional, wc, CONTROL_NODES, wc.control_nodes)
                    tg.start_soon(self._watch_optional, wc, AUTOPILOT_PLANS, wc.plans)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._close(wc)

    async def _watch_nodes(self, wc: WorkloadCluster) -> None:
        assert wc.client is not None
        cache = wc.nodes
        reflector = Reflector(wc.client, NODES, sink=cache.take_event,
                              watch_timeout=self.watch_timeout, spread=0.5,
                              idle_timeout=self.idle_timeout,
                              backoff=Backoff(initial=0.1, maximum=5.0),
                              on_health=functools.partial(self.changed, wc.key),
                              keep_objects=False, relist_limiter=self._relists,
                              decoder=node_subset)
        wc.node_reflector = reflector

        async def mark_synced() -> None:
            await reflector.synced.wait()
            cache.mark_synced()

        async with anyio.create_task_group() as tg:
            tg.start_soon(mark_synced)
            await reflector.run()

    async def _watch_optional(self, wc: WorkloadCluster, resource: Resource,
                              store: RecordCache[Any]) -> None:
        """Watch ``resource`` into ``store`` where its CRD exists: ControlNodes (k0s
        autopilot) and autopilot Plans (someone else's rollout; k0s-fleet's own autopilot
        executor signals nodes and never creates a Plan). Without the CRD the store is
        synced and empty and the CRD itself is watched until it is established (no
        polling); a CRD removed later goes back to that."""
        assert wc.client is not None
        while True:
            await self._until_served(wc, resource, store)
            reflector = Reflector(wc.client, resource, sink=store.take_event,
                                  watch_timeout=self.watch_timeout, spread=0.5,
                                  idle_timeout=self.idle_timeout, keep_objects=False,
                                  relist_limiter=self._relists, stop_when_absent=True,
                                  decoder=plan_subset if resource == AUTOPILOT_PLANS
                                  else node_subset,
                                  backoff=Backoff(initial=0.1, maximum=5.0),
                                  on_health=functools.partial(self.changed, wc.key))
            wc.optional_reflectors[resource.kind] = reflector

            async def mark_synced(r: Reflector = reflector) -> None:
                await r.synced.wait()
                store.mark_synced()

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(mark_synced)
                    await reflector.run()  # returns when the resource is no longer served
                    tg.cancel_scope.cancel()
            finally:
                wc.optional_reflectors.pop(resource.kind, None)
            store.mark_synced()

    async def _until_served(self, wc: WorkloadCluster, resource: Resource,
                            store: RecordCache[Any]) -> None:
        """Return once ``resource`` is served; meanwhile ``store`` is synced and empty.
        Waits on a watch of its CRD; where that cannot be read (no permission to read
        CRDs, say), asks again with backoff. Until the resource is found, a failing search
        counts toward "unreachable" as a failing watch would; a 404 (not served) is an
        answer."""
        assert wc.client is not None
        crd = f"{resource.plural}.{resource.group}"
        backoff = Backoff(initial=1.0, maximum=60.0)
        probe = wc.optional_probes[resource.kind] = WatchHealth()
        established = False
        try:
            while True:
                try:
                    await wc.client.list(resource, page_size=1)
                except NotFoundError:
                    self._answered(wc.key, probe)
                    store.mark_synced()
                    if established:  # established, not served yet: give discovery a moment
                        await anyio.sleep(backoff.next_delay())
                except KubeError as e:
                    probe.failed(e)
                    self.changed(wc.key)
                    await anyio.sleep(min(backoff.next_delay(), 5.0))
                    continue
                else:
                    self._answered(wc.key, probe)
                    return
                try:
                    established = await crd_established(wc.client, crd,
                                                         timeout_seconds=self.watch_timeout,
                                                         idle_timeout=self.idle_timeout)
                except KubeError as e:
                    established = False
                    log.debug("workload cluster %s: cannot watch CRD %s (%s); asking again "
                              "with backoff", wc.name, crd, e)
                    await anyio.sleep(backoff.next_delay())
        finally:
            wc.optional_probes.pop(resource.kind, None)

    def _answered(self, key: ClusterKey, probe: WatchHealth) -> None:
        if probe.failing_since is not None:
            probe.succeeded()
            self.changed(key)  # the cluster may be reachable again: plan on it

    @staticmethod
    async def _close(wc: WorkloadCluster) -> None:
        client, wc.client = wc.client, None
        if client is not None:
            try:
                await client.close()
            except Exception as e:  # closing must never mask the reason we stopped
                log.debug("closing client of %s: %s", wc.name, e)


def kubeconfig_secret(name: str, namespace: str, cluster: str, kubeconfig: Mapping[str, Any]
                      ) -> KubeObject:
    """The Secret CAPI writes for a workload cluster (used by tests and the demo)."""
    return {
        "apiVersion": SECRETS.api_version, "kind": SECRETS.kind,
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "type": "cluster.x-k8s.io/secret",
        "data": {KUBECONFIG_KEY: base64.b64encode(
            yaml.safe_dump(dict(kubeconfig)).encode()).decode()},
    }
