"""The client layer against a real kube-apiserver + etcd, over each transport
(``generated``: kubernetes-asyncio; ``light``: fleet.kube.http, the node agent's).

The same tests are the contract of kubesim (fleet.testing.kubesim), the stand-in for
workload API servers in the scale benchmarks: every test runs against both servers
(``backend``/``scratch`` parameters ``kube-apiserver`` and ``kubesim``), unchanged.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.contract.signal import SIGNAL_VERSION_KEY
from fleet.kube import (
    AlreadyExistsError,
    ConflictError,
    GoneError,
    KubeClient,
    NotFoundError,
    UnauthorizedError,
    UnreachableError,
    patch_with_retry,
)
from fleet.kube.cache import ObjectCache
from fleet.kube.errors import ServerError
from fleet.kube.resources import CONFIGMAPS, NAMESPACES, NODES
from fleet.kube.transport import TRANSPORTS, TransportName
from fleet.kube.watch import Reflector, WatchEvent, watch_once
from fleet.testing.kubesim import KubeSimThread
from fleet.testing.world import World
from fleet.world.clusters import node_cache
from fleet.world.kept import project
from fleet.world.records import NodeRecord
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

BACKENDS = ("kube-apiserver", "kubesim")


@dataclass(frozen=True)
class Backend:
    """One API server the tests talk to: the real one or kubesim's virtual cluster."""

    kubeconfig: Callable[..., dict[str, Any]]  # (token=None) -> kubeconfig
    restart: Callable[[], None]
    expire_history: Callable[[], None]  # old resourceVersions now answer 410 Gone


@pytest.fixture(scope="module")
def kubesim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeSimThread]:
    sim = KubeSimThread(Path(tmp_path_factory.mktemp("kubesim"))).start()
    for cluster in ("shared", "scratch"):
        sim.call(lambda c=cluster: sim.sim.add_cluster(c))
    try:
        yield sim
    finally:
        sim.close()


def _sim_backend(sim: KubeSimThread, cluster: str) -> Backend:
    def kubeconfig(token: str | None = None) -> dict[str, Any]:
        return sim.sim.kubeconfig(cluster, token)

    def expire() -> None:
        sim.call(sim.sim.clusters[cluster].compact)

    return Backend(kubeconfig, sim.restart, expire)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """The shared server: the session's management kube-apiserver, or kubesim."""
    if request.param == "kubesim":
        return _sim_backend(request.getfixturevalue("kubesim"), "shared")
    server = request.getfixturevalue("crds_installed")["mgmt"]
    return Backend(server.kubeconfig, _no_restart, _no_restart)


def _no_restart() -> None:
    raise AssertionError("the shared API server must not be restarted; use scratch")


@pytest.fixture
async def namespace(backend: Backend) -> AsyncIterator[str]:
    """A fresh namespace on the backend, deleted afterwards."""
    name = unique("t")
    async with await KubeClient.from_kubeconfig(backend.kubeconfig()) as c:
        await c.create(NAMESPACES, {"metadata": {"name": name}})
        try:
            yield name
        finally:
            await c.delete(NAMESPACES, name)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> TransportName:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def kube(backend: Backend, transport: TransportName) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(backend.kubeconfig(),
                                                name="mgmt", transport=transport) as c:
        yield c


async def test_crud_and_typed_errors(kube: KubeClient, namespace: str) -> None:
    cm = await kube.create(CONFIGMAPS, {"metadata": {"name": "a", "namespace": namespace},
                                        "data": {"k": "v"}})
    with pytest.raises(AlreadyExistsError):
        await kube.create(CONFIGMAPS, {"metadata": {"name": "a", "namespace": namespace}})
    stale = cm["metadata"]["resourceVersion"]
    await kube.patch(CONFIGMAPS, "a", {"data": {"k": "w"}}, namespace)
    with pytest.raises(ConflictError):
        await kube.patch(CONFIGMAPS, "a", {"metadata": {"resourceVersion": stale},
                                           "data": {"k": "x"}}, namespace)
    with pytest.raises(NotFoundError):
        await kube.get(CONFIGMAPS, "missing", namespace)
    assert await kube.get_or_none(CONFIGMAPS, "missing", namespace) is None


async def test_bad_token_is_unauthorized(backend: Backend, transport: TransportName) -> None:
    async with await KubeClient.from_kubeconfig(backend.kubeconfig(token="not-a-token"),
                                                transport=transport) as c:
        with pytest.raises(UnauthorizedError):
            await c.list(NODES)


async def test_list_is_paginated(kube: KubeClient, namespace: str) -> None:
    for i in range(7):
        await kube.create(CONFIGMAPS, {"metadata": {"name": f"p{i}", "namespace": namespace}})
    listed = await kube.list(CONFIGMAPS, namespace, page_size=2)
    names = sorted(o["metadata"]["name"] for o in listed.items)
    assert [n for n in names if n.startswith("p")] == [f"p{i}" for i in range(7)]
    assert listed.resource_version
    assert all(o["kind"] == "ConfigMap" for o in listed.items)


async def test_concurrent_writers_both_land_through_real_conflicts(
    kube: KubeClient, namespace: str
) -> None:
    """Two writers hammer one object; every intent lands, and 409s really happened."""
    await kube.create(CONFIGMAPS, {"metadata": {"name": "hot", "namespace": namespace},
                                   "data": {}})
    writes = 15
    mutate_calls = {"a": 0, "b": 0}

    async def writer(who: str) -> None:
        for i in range(writes):
            def mutate(obj: dict[str, Any], i: int = i) -> dict[str, Any]:
                mutate_calls[who] += 1
                # Read-modify-write of one shared key: lost updates would show as a short log.
                log = json.loads((obj.get("data") or {}).get("log", "[]"))
                return {"data": {"log": json.dumps([*log, f"{who}{i}"])}}

            await patch_with_retry(kube, CONFIGMAPS, "hot", mutate, namespace)

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer, "a")
        tg.start_soon(writer, "b")
    final = await kube.get(CONFIGMAPS, "hot", namespace)
    log = json.loads(final["data"]["log"])
    expected = [f"a{i}" for i in range(writes)] + [f"b{i}" for i in range(writes)]
    assert sorted(log) == sorted(expected)
    assert [x for x in log if x.startswith("a")] == [f"a{i}" for i in range(writes)]
    # More mutate calls than writes means some attempts hit a 409 and were re-read.
    assert sum(mutate_calls.values()) > 2 * writes


async def test_patch_with_retry_declines_when_mutate_says_so(
    kube: KubeClient, namespace: str
) -> None:
    await kube.create(CONFIGMAPS, {"metadata": {"name": "d", "namespace": namespace},
                                   "data": {"owner": "other"}})
    result = await patch_with_retry(
        kube, CONFIGMAPS, "d",
        lambda o: None if o["data"]["owner"] != "me" else {"data": {"x": "1"}}, namespace,
    )
    assert result is None
    assert "x" not in (await kube.get(CONFIGMAPS, "d", namespace))["data"]


@pytest.mark.parametrize("taker", ["listener", "sink"])
async def test_reflector_tracks_changes_and_deletions(kube: KubeClient, namespace: str,
                                                      taker: str) -> None:
    # "sink": each event taken at once in the connection's callback (watch_into)
    events: list[WatchEvent] = []
    seen = anyio.Event()

    def take(ev: WatchEvent) -> None:
        events.append(ev)
        if ev.type == "DELETED" and ev.object["metadata"]["name"] == "r1":
            seen.set()

    async def listener(ev: WatchEvent) -> None:
        take(ev)

    refl = Reflector(kube, CONFIGMAPS, namespace=namespace, listener=listener) \
        if taker == "listener" else Reflector(kube, CONFIGMAPS, namespace=namespace, sink=take)
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        with anyio.fail_after(10):
            await refl.synced.wait()
        await kube.create(CONFIGMAPS, {"metadata": {"name": "r1", "namespace": namespace}})
        await kube.patch(CONFIGMAPS, "r1", {"data": {"a": "b"}}, namespace)
        await kube.delete(CONFIGMAPS, "r1", namespace)
        with anyio.fail_after(10):
            await seen.wait()
        tg.cancel_scope.cancel()
    kinds = [e.type for e in events if e.object["metadata"]["name"] == "r1"]
    assert kinds == ["ADDED", "MODIFIED", "DELETED"]
    assert refl.get("r1", namespace) is None


async def _watch_until(refl: Reflector, kube: KubeClient, namespace: str,
                       reopened: Callable[[], bool]) -> None:
    """Run ``refl`` until ``reopened()``, then check a change made after is still seen."""
    name = unique("after")
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        with anyio.fail_after(60):
            await refl.synced.wait()
        await _wait_for(reopened, timeout=60)
        await kube.create(CONFIGMAPS, {"metadata": {"name": name, "namespace": namespace}})
        await _wait_for(lambda: refl.get(name, namespace) is not None)
        tg.cancel_scope.cancel()


async def test_watch_ended_by_the_server_resumes_without_a_relist(
        kube: KubeClient, namespace: str) -> None:
    # timeoutSeconds=2: the server ends every watch after 2 s; each is resumed from the
    # last resourceVersion (one watch request), never a list, and misses nothing.
    refl = Reflector(kube, CONFIGMAPS, namespace=namespace, watch_timeout=2, spread=0.0)
    await _watch_until(refl, kube, namespace, lambda: refl.watches >= 3)
    assert refl.relists == 1
    assert refl.reconnects == 0 and refl.idle_resumes == 0


async def test_silent_watch_is_resumed_without_a_relist(
        kube: KubeClient, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    # A watch that says nothing (not even a bookmark) for its idle bound is resumed from
    # its resourceVersion, as if its connection were dead: no list, no failure recorded;
    # a warning says so (a server holding changes back shows this way).
    refl = Reflector(kube, CONFIGMAPS, namespace=namespace, watch_timeout=600,
                     idle_timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="fleet.kube.watch"):
        await _watch_until(refl, kube, namespace, lambda: refl.idle_resumes >= 2)
    assert refl.relists == 1
    assert refl.reconnects == 0 and refl.failing_for() == 0
    assert refl.watches >= 3
    assert sum("said nothing (no event, no bookmark) for 1 s" in r.getMessage()
               for r in caplog.records) >= 2


# -- many watches, bursts of changes, readers fast and stalled ---------------------


@pytest.fixture(scope="module")
def chatty_kubesim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeSimThread]:
    """A kubesim whose watches are sent a bookmark every 20 ms (the real API server: about
    every minute): bookmarks come due as often as changes arrive, the moment at which
    kubesim once left a change unsent (a watch silent until its client gave up on it)."""
    sim = KubeSimThread(Path(tmp_path_factory.mktemp("chatty")), bookmark_seconds=0.02).start()
    sim.call(lambda: sim.sim.add_cluster("busy"))
    try:
        yield sim
    finally:
        sim.close()


@pytest.fixture(params=BACKENDS)
def busy_backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "kubesim":
        return _sim_backend(request.getfixturevalue("chatty_kubesim"), "busy")
    server = request.getfixturevalue("crds_installed")["mgmt"]
    return Backend(server.kubeconfig, _no_restart, _no_restart)


WATCHERS, STALLED, BURSTS, BURST = 10, 2, 8, 5
PAD = "p" * 40_000  # each event ~40 KB: three TLS records, a watch line split across them


async def test_every_change_reaches_every_watch_promptly(busy_backend: Backend,
                                                         transport: TransportName) -> None:
    """Ten watches of one object (each its own connection), bursts of changes; between
    bursts every watch must have been sent the burst, within 10 s of its writing; two
    watches stop reading until the last burst (the server's writes to them back up) and
    then must be sent every change too, in order. What a controller's Node watches see
    of a node agent's steps: a change not sent until the watch is re-opened (150 s later
    in the controller) was a stalled rollout."""
    ns = unique("burst")
    written: dict[int, float] = {}  # value -> when its patch was sent
    seen: list[list[int]] = [[] for _ in range(WATCHERS)]
    late: list[float] = []
    released = anyio.Event()
    progressed = anyio.Event()  # some watch saw something new

    def listener(k: int) -> Callable[[WatchEvent], Any]:
        async def on_event(ev: WatchEvent) -> None:
            nonlocal progressed
            if ev.type != "MODIFIED" or ev.object["metadata"]["name"] != "cm":
                return
            if k < STALLED:
                await released.wait()  # not reading the stream meanwhile
            value = int(ev.object["data"]["i"])
            seen[k].append(value)
            if k >= STALLED:
                late.append(time.monotonic() - written[value])
            progressed.set()
            progressed = anyio.Event()
        return on_event

    async def caught_up(value: int, watchers: range) -> None:
        while not all(seen[k] and seen[k][-1] >= value for k in watchers):
            await progressed.wait()

    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(await KubeClient.from_kubeconfig(
            busy_backend.kubeconfig(), name="writer", transport=transport))
        await writer.create(NAMESPACES, {"metadata": {"name": ns}})
        stack.push_async_callback(writer.delete, NAMESPACES, ns)
        await writer.create(CONFIGMAPS, {"metadata": {"name": "cm", "namespace": ns},
                                         "data": {"i": "0", "pad": PAD}}, ns)
        reflectors = []
        for k in range(WATCHERS):
            client = await stack.enter_async_context(await KubeClient.from_kubeconfig(
                busy_backend.kubeconfig(), name=f"watch-{k}", transport=transport))
            reflectors.append(Reflector(client, CONFIGMAPS, namespace=ns,
                                        listener=listener(k), keep_objects=False))
        with anyio.fail_after(60):  # kubesim before the fix: a watch stayed silent
            async with anyio.create_task_group() as tg:
                for r in reflectors:
                    tg.start_soon(r.run)
                for r in reflectors:
                    await r.synced.wait()
                value = 0
                for _ in range(BURSTS):
                    for _ in range(BURST):
                        value += 1
                        written[value] = time.monotonic()
                        await writer.patch(CONFIGMAPS, "cm", {"data": {"i": str(value)}}, ns)
                    await caught_up(value, range(STALLED, WATCHERS))
                released.set()
                await caught_up(value, range(WATCHERS))
                tg.cancel_scope.cancel()
    everything = list(range(1, BURSTS * BURST + 1))
    assert seen == [everything] * WATCHERS
    assert max(late) < 10.0, f"a change reached a reading watch {max(late):.1f} s late"
    assert all(r.relists == 1 for r in reflectors)


# -- destructive tests on a private API server --------------------------------------


@pytest.fixture(scope="module")
def scratch_world() -> Iterator[World]:
    """A private etcd + API server that tests may restart and compact."""
    # No watch cache: watches then read etcd directly, so compacting etcd expires old
    # resourceVersions and the 410 path is exercised for real.
    w = World(["scratch"], extra_args={"scratch": ["--watch-cache=false"]})
    w.start()
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(params=BACKENDS)
def scratch(request: pytest.FixtureRequest) -> Backend:
    """A server tests may restart and whose history they may expire."""
    if request.param == "kubesim":
        return _sim_backend(request.getfixturevalue("kubesim"), "scratch")
    w: World = request.getfixturevalue("scratch_world")
    return Backend(w["scratch"].kubeconfig, w["scratch"].restart, lambda: _etcd_compact(w))


@pytest.fixture
async def scratch_client(scratch: Backend, transport: TransportName) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(scratch.kubeconfig(),
                                                name="scratch", transport=transport) as c:
        yield c


async def _wait_for(cond: Any, timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not cond():
            await anyio.sleep(0.02)


async def test_watch_survives_apiserver_restart(scratch: Backend,
                                                scratch_client: KubeClient) -> None:
    node = unique("restart")
    refl = Reflector(scratch_client, NODES, field_selector=f"metadata.name={node}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        await scratch_client.create(NODES, {"metadata": {"name": node}})
        await _wait_for(lambda: refl.get(node) is not None)
        await anyio.to_thread.run_sync(scratch.restart)
        await scratch_client.patch(NODES, node, {"metadata": {"labels": {"after": "restart"}}})
        await _wait_for(
            lambda: ((refl.get(node) or {}).get("metadata", {}).get("labels") or {}).get("after")
            == "restart"
        )
        tg.cancel_scope.cancel()
    assert refl.reconnects >= 1


async def test_many_requests_and_watches_at_once_through_a_restart(
        scratch_world: World, transport: TransportName) -> None:
    """One client: 8 watches and 16 tasks listing 2.4 MB at a time, and the API server
    restarting in the middle. Every list ends (with the objects, or unreachable or a
    5xx while the server goes down), and every watch catches up with writes made after the restart:
    a transport that stalls fails the deadline.

    The real kube-apiserver only (its own process): against kubesim, whose server runs
    inside the test process, one full-suite run reported 8 unclosed asyncio TLS
    transports collected during this test (not reproduced alone; origin not found)."""
    server = scratch_world["scratch"]
    async with await KubeClient.from_kubeconfig(server.kubeconfig(), name="scratch",
                                                transport=transport) as scratch_client:
        await _many_requests_and_watches(scratch_client, server.restart)


async def _many_requests_and_watches(scratch_client: KubeClient,
                                     restart: Callable[[], None]) -> None:
    ns = unique("stress")
    await scratch_client.create(NAMESPACES, {"metadata": {"name": ns}})
    names = [f"cm-{i}" for i in range(12)]
    for name in names:
        await scratch_client.create(CONFIGMAPS, {"metadata": {"name": name},
                                                 "data": {"big": "x" * 200_000}}, ns)
    watches = [Reflector(scratch_client, CONFIGMAPS, namespace=ns) for _ in range(8)]
    listed: list[int] = []
    unreachable: list[str] = []

    async def lists(rounds: int) -> None:
        for _ in range(rounds):
            try:
                listed.append(len((await scratch_client.list(CONFIGMAPS, ns)).items))
            except (UnreachableError, ServerError) as e:  # down, or "shutting down"
                unreachable.append(str(e))

    def caught_up(r: Reflector) -> bool:
        return all(((r.get(n, ns) or {}).get("data") or {}).get("round") == "2"
                   for n in names)

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for r in watches:
                tg.start_soon(r.run)
            for r in watches:
                await r.synced.wait()
            async with anyio.create_task_group() as busy:
                for _ in range(16):
                    busy.start_soon(lists, 6)
                await anyio.to_thread.run_sync(restart)
            for name in names:
                await scratch_client.patch(CONFIGMAPS, name, {"data": {"round": "2"}}, ns)
            await _wait_for(lambda: all(caught_up(r) for r in watches), timeout=120)
            await lists(2)
            tg.cancel_scope.cancel()
    assert len(listed) + len(unreachable) == 16 * 6 + 2
    assert listed[-2:] == [12, 12] and set(listed) == {12}
    await scratch_client.delete(NAMESPACES, ns)


def _etcd_compact(world: World) -> int:
    """Compact etcd to its current revision through etcd's JSON gateway."""
    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"{world.etcd.url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    rev = int(call("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    call("/v3/kv/compaction", {"revision": rev, "physical": True})
    return rev


@pytest.mark.parametrize("taker", ["listener", "sink"])
async def test_expired_resource_version_leads_to_relist(
    scratch: Backend, scratch_client: KubeClient, taker: str
) -> None:
    node = unique("gone")
    created = await scratch_client.create(NODES, {"metadata": {"name": node}})
    old_rv = created["metadata"]["resourceVersion"]
    for i in range(5):
        await scratch_client.patch(NODES, node, {"metadata": {"labels": {"n": str(i)}}})
    await anyio.to_thread.run_sync(scratch.expire_history)
    # The finite core reports the expiry as a typed error ...
    with pytest.raises(GoneError):
        async for _ in watch_once(scratch_client, NODES, old_rv,
                                  field_selector=f"metadata.name={node}", timeout_seconds=5):
            pass
    # ... and the reflector answers it with a re-list instead of crashing (a sink's
    # watch reads the ERROR event in the connection's callback, and raises it after)
    taken: list[WatchEvent] = []
    refl = Reflector(scratch_client, NODES, field_selector=f"metadata.name={node}",
                     sink=taken.append if taker == "sink" else None)
    refl.store = {("", node): created}
    refl.resource_version = old_rv  # resume from a revision etcd no longer has
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        await _wait_for(lambda: refl.relists >= 1)
        await _wait_for(lambda: (refl.get(node) or {}).get("metadata", {})
                        .get("labels", {}).get("n") == "4")
        tg.cancel_scope.cancel()
    if taker == "sink":
        assert [e.object["metadata"]["labels"]["n"] for e in taken] == ["4"]


@pytest.mark.parametrize("taker", ["listener", "sink"])
async def test_records_only_relist_deletions_and_patch_preconditions(
    scratch: Backend, scratch_client: KubeClient, taker: str
) -> None:
    """A Reflector that keeps only resourceVersions, feeding a RecordCache: no full object
    is held, a deletion missed while the watch was down comes out of the re-list (410 on
    a compacted revision), and a patch based on a record whose object moved on gets a
    real 409 and is re-decided on a fresh read."""
    mark = unique("rec")
    a, b = f"{mark}-a", f"{mark}-b"
    cache = node_cache()
    refl = Reflector(scratch_client, NODES, label_selector=f"mark={mark}",
                     listener=cache.on_event if taker == "listener" else None,
                     sink=cache.take_event if taker == "sink" else None, keep_objects=False)
    for name in (a, b):
        await scratch_client.create(NODES, {"metadata": {"name": name, "labels": {"mark": mark},
                                                         "annotations": {"unrelated": "x"}}})
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        await _wait_for(lambda: cache.get(a) is not None and cache.get(b) is not None)
        tg.cancel_scope.cancel()
    assert refl.store == {} and refl.items() == []
    rec = cache.get(a)
    assert isinstance(rec, NodeRecord) and rec.annotations == ()
    # b goes while nobody watches, and the revision the watch would resume from expires
    await scratch_client.delete(NODES, b)
    await anyio.to_thread.run_sync(scratch.expire_history)
    relists = refl.relists
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        await _wait_for(lambda: refl.relists > relists and cache.get(b) is None)
        tg.cancel_scope.cancel()
    assert cache.get(a) is not None
    # someone else writes a; our patch still starts from the (now stale) record
    base = cache.object(a)
    assert base is not None
    await scratch_client.patch(NODES, a, {"metadata": {"annotations": {"other": "writer"}}})
    seen: list[str] = []

    def mutate(obj: dict[str, Any]) -> dict[str, Any]:
        seen.append(obj["metadata"]["resourceVersion"])
        return {"metadata": {"annotations": {SIGNAL_VERSION_KEY: "v2"}}}

    patched = await patch_with_retry(scratch_client, NODES, a, mutate, current=base)
    assert patched is not None
    assert len(seen) == 2 and seen[0] == base["metadata"]["resourceVersion"]  # a 409 first
    ann = patched["metadata"]["annotations"]
    assert ann["other"] == "writer" and ann[SIGNAL_VERSION_KEY] == "v2"
    cache.observe(patched)  # the write-through keeps what is ours and drops the rest
    rec = cache.get(a)
    assert rec is not None and rec.annotations == ((SIGNAL_VERSION_KEY, "v2"),)
    assert rec.resource_version == patched["metadata"]["resourceVersion"]


@pytest.mark.parametrize("from_cache", [False, True], ids=["own-versions", "cache-versions"])
async def test_projected_cache_from_paged_relists_and_patch_preconditions(
    scratch: Backend, scratch_client: KubeClient, from_cache: bool
) -> None:
    """The management caches' set-up (fleet/world/kept.py): a Reflector that keeps only
    resourceVersions (or, ``from_cache``, keeps none and asks the cache it feeds for them
    on a re-list) and lists page by page (here 2 objects a page) feeds an ObjectCache
    that keeps a projection of each object. Every object arrives, only the projection is
    held, a deletion missed while the watch was down comes out of a paged re-list, and a
    patch computed on the projection is refused (a real 409) once a field the projection
    dropped moved on the server, then re-decided on a fresh read, leaving that field
    as the other writer left it."""
    mark = unique("kept")
    names = [f"{mark}-{i}" for i in range(5)]
    cache = ObjectCache("Node", keep=lambda o: project(o, {
        "metadata": {"name": True, "resourceVersion": True, "labels": True},
        "spec": {"unschedulable": True}}))
    refl = Reflector(scratch_client, NODES, label_selector=f"mark={mark}",
                     listener=cache.on_event, keep_objects=False, page_size=2,
                     versions=functools.partial(cache.versions, "") if from_cache else None)
    for name in names:
        await scratch_client.create(NODES, {
            "metadata": {"name": name, "labels": {"mark": mark},
                         "annotations": {"dropped": "x"}},
            "spec": {"podCIDR": "10.0.0.0/24"}})
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        await _wait_for(lambda: refl.synced.is_set() and len(cache) == 5)
        tg.cancel_scope.cancel()
    assert refl.store == {} and refl.relists == 1
    got = cache.get(names[0])
    assert got is not None and "annotations" not in got["metadata"] and "spec" in got
    assert got["spec"] == {} and got["metadata"]["labels"] == {"mark": mark}
    # two go while nobody watches, and the revision the watch would resume from expires
    for name in names[3:]:
        await scratch_client.delete(NODES, name)
    await anyio.to_thread.run_sync(scratch.expire_history)
    async with anyio.create_task_group() as tg:
        tg.start_soon(refl.run)
        await _wait_for(lambda: refl.relists >= 2 and len(cache) == 3)
        tg.cancel_scope.cancel()
    assert sorted(o["metadata"]["name"] for o in cache) == names[:3]
    assert (refl._versions == {}) is from_cache  # no second copy of the cache's versions
    # someone else writes a dropped field of names[0]; our patch starts from the kept copy
    base = cache.object(names[0])
    assert base is not None
    await scratch_client.patch(NODES, names[0], {"metadata": {"annotations": {"dropped": "y"}}})
    seen: list[str] = []

    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(obj["metadata"]["resourceVersion"])
        if (obj.get("spec") or {}).get("unschedulable"):
            return None
        return {"spec": {"unschedulable": True}}

    patched = await patch_with_retry(scratch_client, NODES, names[0], mutate, current=base)
    assert patched is not None
    assert len(seen) == 2 and seen[0] == base["metadata"]["resourceVersion"]  # a 409 first
    assert patched["metadata"]["annotations"]["dropped"] == "y"
    cache.observe(patched)  # the write-through keeps only the projection
    got = cache.get(names[0])
    assert got == {"metadata": {"name": names[0], "labels": {"mark": mark},
                                "resourceVersion": patched["metadata"]["resourceVersion"]},
                   "spec": {"unschedulable": True}}
    for name in names[:3]:
        await scratch_client.delete(NODES, name)
