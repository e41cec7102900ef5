"""Conflict-retrying merge patches with a resourceVersion precondition."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import anyio

from fleet.kube.backoff import Backoff
from fleet.kube.client import MERGE_PATCH, KubeClient, KubeObject
from fleet.kube.errors import ConflictError, KubeError
from fleet.kube.resources import Resource

log = logging.getLogger(__name__)

Mutation = Callable[[KubeObject], dict[str, Any] | None]


class ConflictRetriesExhaustedError(KubeError):
    status = 409


async def patch_with_retry(
    client: KubeClient,
    res: Resource,
    name: str,
    mutate: Mutation,
    namespace: str | None = None,
    *,
    subresource: str | None = None,
    current: KubeObject | None = None,
    attempts: int = 60,
    backoff: Backoff | None = None,
) -> KubeObject | None:
    """Apply ``mutate``'s merge patch under optimistic concurrency until it lands.

    ``mutate`` receives the freshest object and returns a JSON merge patch, or None when
    the change is no longer wanted (the request it belonged to was replaced, say). The
    patch is sent with ``metadata.resourceVersion`` of that object, so it applies only to
    exactly what ``mutate`` looked at; on 409 the object is re-read and ``mutate`` runs
    again. Returns the patched object, or None when ``mutate`` declined.
    ``current`` may pass an object already read, saving the first GET.
    """
    backoff = backoff or Backoff(initial=0.02, maximum=1.0)
    obj = current
    for attempt in range(1, attempts + 1):
        if obj is None:
            obj = await client.get(res, name, namespace)
        patch = mutate(copy.deepcopy(obj))
        if patch is None:
            return None
        patch = copy.deepcopy(patch)
        patch.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
        try:
            return await client.patch(res, name, patch, namespace, content_type=MERGE_PATCH,
                                      subresource=subresource)
        except ConflictError:
            log.debug("conflict patching %s %s/%s (attempt %d)", res, namespace, name, attempt)
            obj = None
            await anyio.sleep(backoff.next_delay())
    raise ConflictRetriesExhaustedError(
        f"{res} {namespace + '/' if namespace else ''}{name}: still conflicting after "
        f"{attempts} attempts"
    )
