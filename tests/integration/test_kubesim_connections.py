"""What kubesim holds per open connection (issue #13: it serves thousands of workload
clusters, each with three or four connections from every controller replica), and that
its TLS layer carries large bodies both ways intact. The API semantics are the contract
test's (test_kube_client.py); this is about kubesim's own server, in its own thread."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from fleet.kube import KubeClient
from fleet.kube.resources import CONFIGMAPS, NODES
from fleet.kube.watch import WatchEvent, watch_once
from fleet.testing.kubesim import KubeSimThread, server
from fleet.testing.kubesim.nodes import realistic_node
from fleet.testing.kubesim.patches import MERGE
from fleet.testing.kubesim.server import TLS_RECORD_BYTES
from fleet.testing.kubesim.store import KINDS, ClusterStore, Selection

SIM_NODES = KINDS[("", "v1", "nodes")]
LARGE = 100_000  # a response body this large must not outlive its sending


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[KubeSimThread]:
    s = KubeSimThread(tmp_path).start()
    try:
        yield s
    finally:
        s.close()


def _seed(sim: KubeSimThread, count: int) -> None:
    store = sim.sim.add_cluster("c1")
    for i in range(count):
        store.create(SIM_NODES, "", realistic_node(f"c1-n{i:02d}", "v1.31.2+k0s.0", index=i))


def _connections(sim: KubeSimThread) -> dict[str, Any]:
    """On the server's loop: each connection's TLS read buffer, and the sent response
    bodies still alive."""
    runner = sim.sim._runner
    assert runner is not None and runner.server is not None
    protocols = [h.transport._ssl_protocol  # type: ignore[union-attr]
                 for h in runner.server.connections]
    held = [o for o in gc.get_objects() if isinstance(o, web.Response)
            and isinstance(o.body, bytes | bytearray) and len(o.body) > LARGE]
    return {"connections": len(protocols),
            "buffers": {id(p._ssl_buffer) for p in protocols},
            "buffer_sizes": {len(p._ssl_buffer) for p in protocols},
            "held_bodies": len(held)}


@pytest.mark.anyio
async def test_a_watch_after_a_large_list_holds_no_buffer_or_body_of_its_own(
        sim: KubeSimThread) -> None:
    sim.call(lambda: _seed(sim, 30))  # a list of ~420 KB: many TLS records
    stored = sim.call(lambda: [o.decode() for o in
                               sim.sim.clusters["c1"].select(Selection(SIM_NODES))])
    async with await KubeClient.for_many(sim.sim.kubeconfig("c1"), name="c1") as client, \
            await KubeClient.for_many(sim.sim.kubeconfig("c1"), name="c1b") as other:
        listed = await client.list(NODES)
        assert listed.items == stored  # intact through the record-by-record writes
        assert len((await other.list(NODES, page_size=5)).items) == 30  # a 2nd connection
        with anyio.fail_after(30):
            # The watch takes the connection the list came on (the client's idle pool),
            # as a controller's Node watch does after its first list.
            events = watch_once(client, NODES, listed.resource_version, timeout_seconds=60)
            opened = anyio.Event()

            async def touch() -> None:
                await opened.wait()
                await other.patch(NODES, "c1-n00", {"metadata": {"labels": {"x": "y"}}})

            async with anyio.create_task_group() as tg:
                tg.start_soon(touch)
                first = events.__anext__()
                opened.set()
                event = await first
                assert isinstance(event, WatchEvent) and event.type == "MODIFIED"
                seen = sim.call(lambda: _connections(sim))
                await events.aclose()
    assert seen["connections"] >= 2
    assert seen["buffers"] == {next(iter(seen["buffers"]))}, \
        "every connection shares its server's one TLS read buffer"
    assert seen["buffer_sizes"] == {TLS_RECORD_BYTES}
    assert seen["held_bodies"] == 0, "a sent response body outlived its sending"


@pytest.mark.anyio
async def test_large_request_and_response_bodies_cross_the_tls_layer_intact(
        sim: KubeSimThread) -> None:
    sim.call(lambda: sim.sim.add_cluster("c1"))
    data = {f"k{i:04d}": f"{i:06d}" * 50 for i in range(1000)}  # ~350 KB of JSON
    async with await KubeClient.for_many(sim.sim.kubeconfig("c1"), name="c1") as client:
        with anyio.fail_after(30):
            created = await client.create(CONFIGMAPS, {
                "metadata": {"name": "big", "namespace": "default"}, "data": data},
                namespace="default")
            assert created["data"] == data
            got = await client.get(CONFIGMAPS, "big", "default")
            assert got["data"] == data
            patched = await client.patch(CONFIGMAPS, "big", {"data": {"k0000": "x" * 70_000}},
                                         namespace="default")
            assert patched["data"] == {**data, "k0000": "x" * 70_000}


# -- watch delivery: every change is sent, whatever comes due at the same moment ---------

BOOKMARK = 0.2  # seconds between bookmarks on the servers below


def _patch_node(store: ClusterStore, value: str) -> None:
    store.patch(SIM_NODES, "", "c1-n00", content_type=MERGE,
                patch={"metadata": {"labels": {"step": value}}})


@pytest.mark.anyio
async def test_a_change_made_as_a_bookmark_comes_due_is_sent(tmp_path: Path) -> None:
    """A Node watch of a 10 x 300 rollout bench went silent for the client's 150 s idle
    bound: kubesim waited for a watch's next change with ``wait_for(queue.get(), ...)``
    up to its next bookmark, and a change queued in the same loop turn as that timer
    fired was left in the queue, never sent (the bookmark skipped for it, every later
    wait cancelled at once). Here the server's loop is held up (as a loaded kubesim's
    is) until the bookmark's timer and a write due just after it are both overdue, so
    the write runs between the timer and the watch's wake-up, every time."""
    sim = KubeSimThread(tmp_path, bookmark_seconds=BOOKMARK).start()
    try:
        sim.call(lambda: _seed(sim, 1))
        store = sim.sim.clusters["c1"]
        async with await KubeClient.for_many(sim.sim.kubeconfig("c1"), name="c1") as client:
            listed = await client.list(NODES)
            events = watch_once(client, NODES, listed.resource_version, timeout_seconds=600)
            with anyio.fail_after(30):
                assert isinstance(await events.__anext__(), str)  # a bookmark: it waits
            for step in ("1", "2", "3"):
                def busy(value: str = step) -> None:
                    # On the server's loop, whose watch is waiting for its next bookmark
                    # (due within BOOKMARK from now): a write due after that, then the
                    # loop held up past both (a stand-in for a loop busy with other
                    # clusters; not a synchronisation: nothing here waits for the test).
                    loop = asyncio.get_running_loop()
                    loop.call_later(1.5 * BOOKMARK, _patch_node, store, value)
                    time.sleep(2 * BOOKMARK)

                sim.call(busy)
                with anyio.fail_after(10):  # old kubesim: not before the watch's end
                    async for event in events:
                        if isinstance(event, WatchEvent):
                            assert event.object["metadata"]["labels"]["step"] == step
                            break
            await events.aclose()
        late, pending = sim.call(lambda: (sim.sim.late_events,
                                          sum(len(w.pending) for w in store.watchers)))
        assert (late, pending) == (0, 0)
    finally:
        sim.close()


@pytest.mark.anyio
async def test_a_watch_without_bookmarks_is_sent_its_changes(tmp_path: Path) -> None:
    """A watch that did not ask for bookmarks: once the bookmark interval had passed, the
    old pump's every wait had no time left and was cancelled before it ran (sending
    nothing, spinning the loop) until the watch's end. Bookmarks every 0 s here: from
    the start."""
    sim = KubeSimThread(tmp_path, bookmark_seconds=0.0).start()
    try:
        sim.call(lambda: _seed(sim, 1))
        store = sim.sim.clusters["c1"]
        async with await KubeClient.for_many(sim.sim.kubeconfig("c1"), name="c1") as client:
            rv = (await client.list(NODES)).resource_version
            stream = await client.open_stream(NODES.path(None), query={
                "watch": "true", "resourceVersion": rv, "timeoutSeconds": 600},
                read_timeout=60)
            try:
                with anyio.fail_after(30):
                    await _wait_until(lambda: sim.call(lambda: len(store.watchers)) == 1)
                    sim.call(lambda: _patch_node(store, "1"))
                    line = await stream.readline()
            finally:
                stream.release()
        event = json.loads(line)
        assert event["type"] == "MODIFIED"
        assert event["object"]["metadata"]["labels"]["step"] == "1"
    finally:
        sim.close()


@pytest.mark.anyio
async def test_a_watch_that_stops_reading_is_sent_every_change_once_it_reads_again(
        sim: KubeSimThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """Back-pressure through kubesim's TLS layer (one record encrypted at a time): a
    watch whose client stops reading while 100 KB changes are made, until the socket is
    over its high-water mark and kubesim's writes to it wait; read again, it is sent every
    change, whole and in order. (Ruled out as the cause of the silent watch: this held
    before the fix too.)"""
    paused: list[int] = []
    original = server._Tls.pause_writing

    def pause_writing(self: server._Tls) -> None:
        paused.append(1)
        original(self)

    monkeypatch.setattr(server._Tls, "pause_writing", pause_writing)
    store = sim.call(lambda: sim.sim.add_cluster("c1"))
    got: list[int] = []
    first, release, done = anyio.Event(), anyio.Event(), anyio.Event()
    async with await KubeClient.for_many(sim.sim.kubeconfig("c1"), name="w") as writer, \
            await KubeClient.for_many(sim.sim.kubeconfig("c1"), name="r") as reader:
        await writer.create(CONFIGMAPS, {"metadata": {"name": "cm", "namespace": "default"},
                                         "data": {"i": "0"}}, "default")
        rv = (await writer.list(CONFIGMAPS, "default")).resource_version
        written = 0

        async def read() -> None:
            async for event in watch_once(reader, CONFIGMAPS, rv, namespace="default",
                                          timeout_seconds=600):
                assert isinstance(event, WatchEvent)
                got.append(int(event.object["data"]["i"]))
                assert event.object["data"]["pad"] == chr(97 + got[-1] % 26) * 100_000
                if len(got) == 1:
                    first.set()
                    await release.wait()  # reads nothing more meanwhile
                if release.is_set() and len(got) == written:
                    done.set()
                    return

        async def write() -> None:
            nonlocal written
            written += 1
            await writer.patch(CONFIGMAPS, "cm", {"data": {
                "i": str(written), "pad": chr(97 + written % 26) * 100_000}}, "default")

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await write()
                await first.wait()
                pending = 0
                while pending < 3 and written < 300:  # until kubesim's writes back up
                    await write()
                    pending = sim.call(lambda: sum(len(w.pending) for w in store.watchers))
                release.set()
                await done.wait()
    assert pending >= 3, f"{written} changes of 100 KB never backed up in kubesim"
    assert paused  # the socket went over its high-water mark
    assert got == list(range(1, written + 1))


async def _wait_until(cond: Callable[[], bool]) -> None:
    while not cond():
        await anyio.sleep(0.02)
