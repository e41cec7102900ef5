"""Unique object names for tests sharing one API server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fleet.kube import KubeClient
from fleet.kube.resources import NAMESPACES


def unique(prefix: str) -> str:
    """A unique object name (cluster-scoped objects such as Nodes are shared per server)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def fresh_namespace(mgmt: KubeClient) -> AsyncIterator[str]:
    """A fresh namespace in ``mgmt``, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await mgmt.create(NAMESPACES, {"metadata": {"name": name}})
    try:
        yield name
    finally:
        await mgmt.delete(NAMESPACES, name)
