"""fleet.world.delta: a collection says what moved only relative to the very generation
its reader last saw; anything else is read whole."""

from __future__ import annotations

from fleet.world.delta import Delta, DeltaDict, DeltaList, generation, moved_since


def test_what_moved_is_told_only_against_the_generation_read_last() -> None:
    first = DeltaDict({"a": 1, "b": 2}, Delta.after(None, ["a", "b"]))
    second = DeltaDict({"a": 1, "c": 3}, Delta.after(first.delta, ["b", "c"]))
    third = DeltaDict({"a": 9, "c": 3}, Delta.after(second.delta, ["a"]))
    assert moved_since(first, 0) is None  # never read: whole
    assert moved_since(second, generation(first)) == {"b", "c"}
    assert moved_since(second, generation(second)) == frozenset()  # the same one again
    assert moved_since(third, generation(first)) is None  # a generation skipped: whole
    assert moved_since({"a": 1}, generation(first)) is None  # a plain dict: whole
    assert generation({"a": 1}) == 0 and generation([1]) == 0


def test_generations_are_never_reused() -> None:
    made = {Delta.after(None, []).gen for _ in range(1000)}
    assert len(made) == 1000 and 0 not in made


def test_a_list_s_lookup_is_its_producer_s() -> None:
    listed = DeltaList([1, 2], Delta.after(None, ["x"]), lambda key: [1] if key == "x" else [])
    assert listed == [1, 2] and listed.lookup is not None and listed.lookup("x") == [1]
    assert DeltaList([], Delta.after(None, [])).lookup is None


def test_the_decided_clusters_are_looked_up_by_key_when_few_and_walked_otherwise() -> None:
    from types import SimpleNamespace  # noqa: PLC0415
    from typing import Any  # noqa: PLC0415

    from fleet.rollout.intents import _decided  # noqa: PLC0415

    progress = [SimpleNamespace(key=("ns", f"c{i:02d}")) for i in range(40)]
    by_key = {c.key: [c] for c in progress}
    asked: list[Any] = []

    def lookup(key: Any) -> list[Any]:
        asked.append(key)
        return by_key.get(key, [])

    listed = DeltaList(progress, Delta.after(None, []), lookup)
    intents = {("ns", "c31"): 1, ("ns", "c04"): 1, ("ns", "gone"): 1}
    walked = [c for c in progress if c.key in intents]
    assert _decided(listed, intents) == walked  # type: ignore[arg-type]
    assert len(asked) == 3  # by key: not a walk over 40
    assert _decided(progress, intents) == progress  # type: ignore[arg-type]  # plain: walked
    stale = DeltaList(progress, Delta.after(None, []), lambda key: None)
    assert _decided(stale, intents) == progress  # type: ignore[arg-type]
