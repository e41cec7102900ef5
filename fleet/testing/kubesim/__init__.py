"""kubesim: a stand-in for workload clusters' kube-apiservers, for tests and benchmarks.

Not Kubernetes: a small aiohttp server of this project that serves many *virtual*
clusters from one process and one TLS port (``/clusters/<name>/...``), with the API
semantics k0s-fleet's client layer depends on (pagination, watches with bookmarks and
410 Gone, resourceVersion preconditions and real 409s, the patch formats, the status
subresource). The client-layer integration tests run unchanged against it and against
the real kube-apiserver (tests/integration/test_kube_client.py), which is what makes
it fit to stand for thousands of workload clusters on one machine (bench/scale.py).
A real cluster's API server remains the reference; nothing here runs in production.

* :mod:`.store`: objects, resourceVersions, history, watchers of one virtual cluster;
* :mod:`.server`: the HTTP API, request counting, TLS;
* :mod:`.standin`: a stand-in for the node agents of its Nodes (rollout benchmarks);
* :mod:`.nodes`: Nodes of realistic size;
* ``python -m fleet.testing.kubesim``: serve as a process (see ``--help``).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from fleet.testing.kubesim.certs import make_serving_cert
from fleet.testing.kubesim.server import KubeSim

T = TypeVar("T")

__all__ = ["KubeSim", "KubeSimThread"]


class KubeSimThread:
    """A KubeSim on its own event loop in a background thread (for tests).

    ``restart()`` stops serving (dropping every connection and watch) and serves again
    on the same port with the same state, as an API server restart over etcd would.
    """

    def __init__(self, workdir: Path, *, token: str | None = None, **options: Any) -> None:
        self.sim = KubeSim(token=token or secrets.token_hex(16),
                           cert=make_serving_cert(workdir / "certs"), **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kubesim",
                                        daemon=True)

    def start(self) -> KubeSimThread:
        self._thread.start()
        self.call_async(self.sim.start)
        return self

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (the store is not thread-safe) and return."""
        fut: Future[T] = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller
                fut.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return fut.result(timeout=60)

    def call_async(self, fn: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout=60)

    def restart(self) -> None:
        self.call_async(self.sim.stop)
        self.call_async(self.sim.start)

    def close(self) -> None:
        if self._thread.is_alive():
            self.call_async(self.sim.stop)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()
