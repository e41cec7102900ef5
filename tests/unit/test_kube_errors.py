import json

import pytest

from fleet.kube.errors import (
    AlreadyExistsError,
    ConflictError,
    GoneError,
    KubeError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
    from_status,
)
from fleet.kube.resources import MACHINES, NODES, PODS


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [(404, "NotFound", NotFoundError), (409, "Conflict", ConflictError),
     (409, "AlreadyExists", AlreadyExistsError), (410, "Expired", GoneError),
     (503, "ServiceUnavailable", ServerError), (418, "Teapot", KubeError)],
)
def test_status_mapping(status: int, reason: str, cls: type[KubeError]) -> None:
    err = from_status(status, json.dumps({"kind": "Status", "reason": reason, "message": "m"}))
    assert type(err) is cls
    assert str(err) == "m"


def test_eviction_429_carries_retry_after() -> None:
    body = {"reason": "TooManyRequests", "message": "Cannot evict pod",
            "details": {"retryAfterSeconds": 7}}
    err = from_status(429, body)
    assert isinstance(err, TooManyRequestsError) and err.retry_after == 7.0


def test_undecodable_body() -> None:
    assert "oops" in str(from_status(500, b"oops"))


def test_paths() -> None:
    assert NODES.path(name="n1") == "/api/v1/nodes/n1"
    assert PODS.path("ns", "p", "eviction") == "/api/v1/namespaces/ns/pods/p/eviction"
    assert MACHINES.path("ns") == "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines"
    assert NODES.path(name="a/b") == "/api/v1/nodes/a%2Fb"
