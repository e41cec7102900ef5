"""Workload cluster clients for the extension on every replica, leader or not.

CAPI calls the extension's Service, which spreads calls over all controller replicas;
the controller's :class:`fleet.world.clusters.ClusterRegistry` lives only on the leader. So
the extension keeps its own small cache: one client per cluster, built from the
cluster's kubeconfig Secret (read on every call: one list by name) and rebuilt when the
Secret's content changes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from fleet.kube import KubeClient, KubeError, UnreachableError
from fleet.kube.resources import SECRETS
from fleet.world.clusters import (
    KubeconfigSecretError,
    kubeconfig_from_secret,
    no_file_credentials,
    secret_digest,
)

log = logging.getLogger(__name__)

ClientFactory = Callable[[Mapping[str, Any], str], Awaitable[KubeClient]]
SecretName = Callable[[str, str], str]


async def _factory(kubeconfig: Mapping[str, Any], name: str, *,
                   allow_files: bool = False) -> KubeClient:
    return await KubeClient.for_many(kubeconfig, name=name, allow_files=allow_files)


def default_secret_name(namespace: str, cluster: str) -> str:
    """CAPI's convention (PROTOCOLS §1): ``<cluster>-kubeconfig`` next to the Cluster."""
    return f"{cluster}-kubeconfig"


@dataclass
class _Entry:
    digest: str
    client: KubeClient


class SecretWorkloadClients:
    """A :data:`~fleet.extension.update.WorkloadClientGetter` from kubeconfig Secrets."""

    def __init__(self, mgmt: KubeClient, *, secret_name: SecretName = default_secret_name,
                 factory: ClientFactory | None = None,
                 allow_file_credentials: Callable[[str], bool] = no_file_credentials
                 ) -> None:
        """``allow_file_credentials``: whether kubeconfig Secrets in a namespace may name
        files (the operator's clusters.kubeconfigSecrets.allowFileCredentials); beyond
        that only inline credentials are accepted (:mod:`fleet.kube.inline`)."""
        self.mgmt = mgmt
        self.secret_name = secret_name
        self.factory = factory
        self.allow_file_credentials = allow_file_credentials
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._locks: dict[tuple[str, str], anyio.Lock] = {}
        self.builds = 0

    async def __call__(self, namespace: str, cluster: str) -> KubeClient:
        key = (namespace, cluster)
        name = self.secret_name(namespace, cluster)
        # A list by name, not a get: the controller's RBAC grants Secrets list+watch only
        # (it watches the kubeconfig Secrets), and this needs no more than that.
        listed = await self.mgmt.list(SECRETS, namespace, field_selector=f"metadata.name={name}")
        if not listed.items:
            raise UnreachableError(
                f"kubeconfig Secret {namespace}/{name} of cluster {cluster} not found")
        secret = listed.items[0]
        digest = secret_digest(secret)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            entry = self._entries.get(key)
            if entry is not None and entry.digest == digest:
                return entry.client
            files = self.allow_file_credentials(namespace)
            factory = self.factory or functools.partial(_factory, allow_files=files)
            try:
                client = await factory(kubeconfig_from_secret(secret, allow_files=files),
                                       f"workload:{namespace}/{cluster}")
            except (KubeconfigSecretError, KubeError, ValueError, OSError) as e:
                # refused (fleet.kube.inline) or unusable: this cluster is unreachable
                raise UnreachableError(f"cluster {namespace}/{cluster}: {e}") from None
            self._entries[key] = _Entry(digest, client)
            self.builds += 1
        if entry is not None:
            log.info("kubeconfig of %s/%s changed; replaced its client", namespace, cluster)
            await entry.client.close()
        return client

    async def close(self) -> None:
        entries, self._entries = self._entries, {}
        for e in entries.values():
            await e.client.close()
