"""Unique object names for tests sharing one API server."""

from __future__ import annotations

import uuid


def unique(prefix: str) -> str:
    """A unique object name (cluster-scoped objects such as Nodes are shared per server)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
