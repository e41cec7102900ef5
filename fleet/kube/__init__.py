"""The project's one way to talk to an API server.

Objects are plain JSON dicts (``KubeObject``); resources are described by
:class:`~fleet.kube.resources.Resource`; every call goes through :class:`KubeClient`,
every API error surfaces as a typed :mod:`fleet.kube.errors` exception.
"""

from fleet.kube.client import KubeClient, KubeObject, ObjectList
from fleet.kube.errors import (
    AlreadyExistsError,
    ConflictError,
    FencedError,
    ForbiddenError,
    GoneError,
    InvalidError,
    KubeError,
    NotFoundError,
    TooManyRequestsError,
    UnauthorizedError,
    UnreachableError,
)
from fleet.kube.patch import patch_with_retry
from fleet.kube.ratelimit import WriteLimiter
from fleet.kube.resources import Resource

__all__ = [
    "AlreadyExistsError",
    "ConflictError",
    "FencedError",
    "ForbiddenError",
    "GoneError",
    "InvalidError",
    "KubeClient",
    "KubeError",
    "KubeObject",
    "NotFoundError",
    "ObjectList",
    "Resource",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnreachableError",
    "WriteLimiter",
    "patch_with_retry",
]
