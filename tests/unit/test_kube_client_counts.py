"""A connection's retry count is one figure, whichever view of the client sent the GET."""

from collections.abc import Sequence
from typing import Any

import pytest

from fleet.kube.client import KubeClient
from fleet.kube.errors import TooManyRequestsError
from fleet.kube.transport import LineStream


class Refusing:
    """A transport answering each path's first GET 429 "again after 0 s", then {}."""

    host = "https://refusing.test"

    def __init__(self) -> None:
        self.refused: set[str] = set()

    async def call(self, method: str, path: str, *, query: Sequence[tuple[str, str]],
                   body: Any, content_type: str, timeout: float | None) -> Any:
        if path not in self.refused:
            self.refused.add(path)
            raise TooManyRequestsError("HTTP 429", status=429, retry_after=0.0)
        return {"path": path}

    async def stream(self, path: str, *, query: Sequence[tuple[str, str]],
                     read_timeout: float) -> LineStream:
        raise NotImplementedError

    async def close(self) -> None:
        pass


@pytest.mark.anyio
async def test_every_view_counts_its_retries_on_the_connection() -> None:
    client = KubeClient(Refusing(), name="mgmt")
    views = [client, client.fenced(lambda: True), client.limited(None),
             client.fenced(lambda: True).limited(None)]
    for i, view in enumerate(views):
        assert await view.request("GET", f"/api/v1/x{i}") == {"path": f"/api/v1/x{i}"}
    assert [v.retries_asked for v in views] == [4] * 4
