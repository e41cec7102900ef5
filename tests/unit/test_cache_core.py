"""The rules both caches share (fleet/kube/cache.py's core), checked on every kind of entry:
an object as sent, a kept projection, a compact record. An object only moves forward, a
deleted one is not brought back by a late event, a newer one after the deletion is, and
syncing, clearing and the change counter behave alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from fleet.kube import KubeObject
from fleet.kube.cache import ObjectCache, RecordCache
from fleet.kube.watch import ObjectKey, WatchEvent

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Fact:
    """A record keeping one fact (``spec.v``); equal whatever its resourceVersion."""

    key: ObjectKey
    v: str
    resource_version: str = field(compare=False)

    def as_object(self) -> KubeObject:
        return {"metadata": {"namespace": self.key[0], "name": self.key[1],
                             "resourceVersion": self.resource_version},
                "spec": {"v": self.v}}


def fact(obj: KubeObject) -> Fact:
    meta = obj["metadata"]
    v = (obj.get("spec") or {}).get("v")
    if not isinstance(v, str):
        raise ValueError("spec.v is not a string")
    return Fact((meta.get("namespace", ""), meta["name"]), v,
                str(meta.get("resourceVersion") or ""))


def keep_spec(obj: KubeObject) -> KubeObject:
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion")
                         if k in meta}, "spec": obj.get("spec")}


def obj(rv: int, v: str = "a", name: str = "o") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv),
                         "managedFields": [{"manager": "m"}]},
            "spec": {"v": v}, "status": {"s": rv}}


def held_v(cache: ObjectCache | RecordCache[Fact], name: str = "o") -> str | None:
    got = cache.object(name, "ns")
    return None if got is None else str(got["spec"]["v"])


def held_rv(cache: ObjectCache | RecordCache[Fact], name: str = "o") -> str | None:
    got = cache.object(name, "ns")
    return None if got is None else str(got["metadata"]["resourceVersion"])


KINDS = {
    "whole": lambda tell: ObjectCache("Thing", on_change=tell),
    "kept": lambda tell: ObjectCache("Thing", on_change=tell, keep=keep_spec),
    "record": lambda tell: RecordCache("Thing", fact, on_change=tell),
}


@pytest.fixture(params=sorted(KINDS))
def cache_and_changes(request: pytest.FixtureRequest
                      ) -> tuple[ObjectCache | RecordCache[Fact], list[int]]:
    changes: list[int] = []
    return KINDS[request.param](lambda: changes.append(1)), changes


async def test_an_object_only_moves_forward_and_a_deleted_one_stays_deleted(
        cache_and_changes: tuple[ObjectCache | RecordCache[Fact], list[int]]) -> None:
    cache, changes = cache_and_changes
    await cache.on_event(WatchEvent("ADDED", obj(10)))
    assert held_v(cache) == "a" and len(cache) == 1 and ("ns", "o") in cache
    assert len(changes) == 1 and cache.version == 1
    await cache.on_event(WatchEvent("MODIFIED", obj(9, "old")))  # older: ignored
    assert held_v(cache) == "a" and held_rv(cache) == "10" and len(changes) == 1
    await cache.on_event(WatchEvent("MODIFIED", obj(12, "b")))
    assert held_v(cache) == "b" and held_rv(cache) == "12" and len(changes) == 2
    await cache.on_event(WatchEvent("DELETED", obj(13, "b")))
    assert held_v(cache) is None and len(cache) == 0 and len(changes) == 3
    await cache.on_event(WatchEvent("MODIFIED", obj(12, "b")))  # late: not brought back
    await cache.on_event(WatchEvent("ADDED", obj(13, "b")))
    assert held_v(cache) is None and len(changes) == 3
    await cache.on_event(WatchEvent("ADDED", obj(14, "c")))  # made again: held
    assert held_v(cache) == "c" and held_rv(cache) == "14" and len(changes) == 4
    await cache.on_event(WatchEvent("MODIFIED", obj(13, "b")))  # older than held
    assert held_v(cache) == "c" and len(changes) == 4


async def test_an_object_without_a_numeric_resource_version_is_taken(
        cache_and_changes: tuple[ObjectCache | RecordCache[Fact], list[int]]) -> None:
    cache = cache_and_changes[0]
    cache.observe(obj(10))
    odd = obj(0, "x")
    odd["metadata"]["resourceVersion"] = "opaque"
    cache.observe(odd)
    assert held_v(cache) == "x"
    cache.observe(obj(5, "y"))  # nothing to compare with: taken
    assert held_v(cache) == "y"
    cache.observe(None)
    cache.observe({})
    assert len(cache) == 1


def test_syncing_and_clearing(
        cache_and_changes: tuple[ObjectCache | RecordCache[Fact], list[int]]) -> None:
    cache, changes = cache_and_changes
    cache.observe(obj(1, name="p"))
    cache.observe(obj(2, name="q"))
    assert not cache.synced and len(changes) == 2
    cache.mark_synced()
    cache.mark_synced()
    assert cache.synced and len(changes) == 3 and cache.version == 3
    cache.clear()
    assert not cache.synced and len(cache) == 0 and len(changes) == 4
    cache.clear()  # nothing held: no change
    assert len(changes) == 4
    cache.observe(obj(1, name="p"))  # cleared, not deleted: no tombstone
    assert held_v(cache, "p") == "a"


@pytest.mark.parametrize("kind", ["kept", "record"])
def test_the_same_facts_at_a_newer_version_are_no_change(kind: str) -> None:
    changes: list[int] = []
    cache = KINDS[kind](lambda: changes.append(1))
    cache.observe(obj(1))
    cache.observe(obj(2))  # only status moved: what is read did not
    assert len(changes) == 1 and held_rv(cache) == "2"


def test_any_change_is_one_for_a_cache_of_whole_objects() -> None:
    changes: list[int] = []
    whole = KINDS["whole"](lambda: changes.append(1))
    whole.observe(obj(1))
    whole.observe(obj(1))  # the same object again: no change
    whole.observe(obj(2))  # status moved: a change for a cache of whole objects
    assert len(changes) == 2


def test_a_record_that_cannot_be_made_drops_the_held_one() -> None:
    changes: list[int] = []
    cache = RecordCache("Thing", fact, on_change=lambda: changes.append(1))
    cache.observe(obj(1))
    bad = obj(2)
    bad["spec"]["v"] = 7
    cache.observe(bad)
    assert cache.get("o", "ns") is None and len(changes) == 2
    assert cache.unreadable == {("ns", "o"): "spec.v is not a string"}
    cache.observe(obj(3))
    assert held_v(cache) == "a" and not cache.unreadable


def test_the_last_comparison_is_remembered_by_the_records_identities() -> None:
    """Caches sharing Nodes compare the same two records one after another; the pair's
    answer is remembered by identity, never taken for another pair."""
    from dataclasses import dataclass  # noqa: PLC0415

    from fleet.kube.cache import _LastCompared  # noqa: PLC0415

    compared: list[tuple[int, int]] = []

    @dataclass(frozen=True)
    class Rec:
        facts: int

        def __eq__(self, other: object) -> bool:
            assert isinstance(other, Rec)
            compared.append((self.facts, other.facts))
            return self.facts == other.facts

        __hash__ = object.__hash__

    differ = _LastCompared()
    a, b, a2 = Rec(1), Rec(2), Rec(1)
    assert differ(b, a) and differ(b, a) and differ(b, a)
    assert compared == [(2, 1)]  # once for the pair
    assert not differ(a2, a) and differ(a, b)  # other pairs: compared afresh
    assert compared == [(2, 1), (1, 1), (1, 2)]
