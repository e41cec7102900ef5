import json

import pytest

from fleet.kube.errors import (
    GET_RETRIES,
    RETRY_AFTER_CAP,
    AlreadyExistsError,
    ConflictError,
    GoneError,
    KubeError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
    from_status,
    retry_wait,
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


def test_a_server_timeout_carries_the_wait_it_asks_for() -> None:
    """A list page the server could not complete (500 ServerTimeout) says when to retry,
    in the Status' details or, failing that, in a Retry-After header."""
    body = {"reason": "ServerTimeout", "message": "The list operation against machines "
            "could not be completed at this time, please try again.",
            "details": {"retryAfterSeconds": 2}}
    err = from_status(500, body)
    assert isinstance(err, ServerError) and err.retry_after == 2.0
    assert from_status(429, b"", {"Retry-After": "1"}).retry_after == 1.0
    assert from_status(503, b"", {"Retry-After": "soon"}).retry_after is None
    assert from_status(500, b"oops").retry_after is None
    # only an answer that may be retried carries one
    assert from_status(409, {"reason": "Conflict", "details": {"retryAfterSeconds": 3}}
                       ).retry_after is None


def test_a_get_is_sent_again_after_the_wait_the_server_asked_bounded() -> None:
    asked = from_status(429, b"", {"Retry-After": "1"})
    assert retry_wait("GET", asked, 0, 0.0) == 1.0
    assert retry_wait("GET", asked, 0, 0.5) == 1.5  # stretched: not all back at once
    assert retry_wait("GET", asked, GET_RETRIES - 1, 0.99) == pytest.approx(1.99)
    assert retry_wait("GET", asked, GET_RETRIES, 0.0) is None  # then the caller hears it
    long = from_status(503, b"", {"Retry-After": "3600"})
    assert retry_wait("GET", long, 0, 0.0) == RETRY_AFTER_CAP
    # a write is not sent twice (a 5xx may have been applied), nor an answer without a
    # wait
    assert retry_wait("PATCH", asked, 0, 0.0) is None
    assert retry_wait("POST", asked, 0, 0.0) is None
    assert retry_wait("GET", from_status(500, b"oops"), 0, 0.0) is None


def test_undecodable_body() -> None:
    assert "oops" in str(from_status(500, b"oops"))


def test_paths() -> None:
    assert NODES.path(name="n1") == "/api/v1/nodes/n1"
    assert PODS.path("ns", "p", "eviction") == "/api/v1/namespaces/ns/pods/p/eviction"
    assert MACHINES.path("ns") == "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines"
    assert NODES.path(name="a/b") == "/api/v1/nodes/a%2Fb"
