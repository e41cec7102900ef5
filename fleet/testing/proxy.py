"""A TCP proxy on loopback that can be made to stall: bytes stop flowing both ways while
connections stay open, the way a hung API server or a black-holed network looks to a
client (nothing fails, nothing answers). Used by fault tests."""

from __future__ import annotations

import contextlib
import time
from types import TracebackType

import anyio
from anyio.abc import SocketStream, TaskGroup


class StallingProxy:
    """Forwards 127.0.0.1:<port> to ``upstream_port``; ``stall()`` / ``resume()``.

    ``stall(replies_only=True)`` holds only what flows back from upstream: requests still
    arrive (and are acted on), their answers do not (a write committed unheard)."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port = upstream_port
        self.host = host
        self.port = 0
        self._flowing = anyio.Event()
        self._flowing.set()
        self._replies = anyio.Event()  # upstream -> client
        self._replies.set()
        self._tg: TaskGroup | None = None
        self.connections = 0  # accepted in total
        self.open = 0  # open right now
        self.peak = 0  # most open at once (a stalled connection closed by its client
        # is only noticed once bytes flow again)
        self.accepted_at: list[float] = []  # monotonic accept times

    @property
    def stalled(self) -> bool:
        return not (self._flowing.is_set() and self._replies.is_set())

    def stall(self, *, replies_only: bool = False) -> None:
        if not replies_only and self._flowing.is_set():
            self._flowing = anyio.Event()
        if self._replies.is_set():
            self._replies = anyio.Event()

    def resume(self) -> None:
        self._flowing.set()
        self._replies.set()

    async def _wait_flowing(self, replies: bool) -> None:
        await (self._replies if replies else self._flowing).wait()

    async def __aenter__(self) -> StallingProxy:
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=0)
        self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()

        async def serve() -> None:
            async with listener:
                await listener.serve(self._handle)

        self._tg.start_soon(serve)
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._tg is not None
        self.resume()
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(et, e, tb)

    async def _pump(self, src: SocketStream, dst: SocketStream, *, replies: bool) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError,
                                 anyio.ClosedResourceError, OSError):
            while True:
                await self._wait_flowing(replies)
                data = await src.receive()
                await self._wait_flowing(replies)  # stalled meanwhile: hold what was read
                await dst.send(data)
        with contextlib.suppress(Exception):
            await dst.send_eof()

    async def _handle(self, client: SocketStream) -> None:
        self.connections += 1
        self.accepted_at.append(time.monotonic())
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            try:
                upstream = await anyio.connect_tcp(self.host, self.upstream_port)
            except OSError:
                await client.aclose()
                return
            async with client, upstream, anyio.create_task_group() as tg:
                tg.start_soon(lambda: self._pump(client, upstream, replies=False))
                tg.start_soon(lambda: self._pump(upstream, client, replies=True))
        finally:
            self.open -= 1


__all__ = ["StallingProxy"]
