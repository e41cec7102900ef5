"""What KubeClient needs from the wire: one request, one streamed GET, close.

Two implementations, chosen when a client is built (``KubeClient.from_kubeconfig(...,
transport=...)``) and interchangeable behind :class:`~fleet.kube.client.KubeClient`:

- ``"generated"`` (:mod:`fleet.kube.generated`): kubernetes-asyncio's ApiClient, with
  every kubeconfig feature it has (exec plugins, auth providers, ...), used when a
  kubeconfig needs one of those (``"auto"``, the controller's and the CLI's choice).
- ``"light"`` (:mod:`fleet.kube.light`): :mod:`fleet.kube.http` on asyncio streams with
  bearer tokens (static, file, the in-cluster projected token re-read as it rotates),
  client certificates and basic auth. The node agent's, and with ``"auto"`` the
  controller's for every kubeconfig that needs nothing more: kubernetes-asyncio's
  generated models cost ~35-70 MiB and ~0.4 s of CPU to import.

Both raise only :mod:`fleet.kube.errors` exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

TransportName = Literal["generated", "light", "auto"]
# The implementations ("auto" picks one of them per kubeconfig).
TRANSPORTS: tuple[TransportName, ...] = ("generated", "light")


class LineStream(Protocol):
    """An open streaming response (a watch)."""

    async def readline(self) -> bytes:
        """The next line, with its newline; b"" when the server ended the stream."""
        ...

    async def pour(self, sink: Callable[[bytes], None]) -> None:
        """Every line (as :meth:`readline` gives it) to ``sink``, until the server ended
        the stream; raises what readline raises, and what ``sink`` raised. ``sink`` may be
        called from the connection's own callback as each line arrives: it must not
        block."""
        ...

    def release(self) -> None: ...


class Transport(Protocol):
    @property
    def host(self) -> str: ...

    async def call(self, method: str, path: str, *, query: Sequence[tuple[str, str]],
                   body: Any, content_type: str, timeout: float | None,
                   decode: Callable[[bytes], Any] | None = None) -> Any:
        """One request; the decoded JSON answer, or a typed KubeError. ``decode``: reads
        the answer's body instead of ``json.loads`` (``ValueError``: undecodable)."""
        ...

    async def stream(self, path: str, *, query: Sequence[tuple[str, str]],
                     read_timeout: float) -> LineStream:
        """Open a streaming GET; errors as typed KubeErrors."""
        ...

    async def close(self) -> None: ...
