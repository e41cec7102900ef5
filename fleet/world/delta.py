"""Per-cluster collections that say which keys moved since the one before them.

A planning pass hands the fleet from stage to stage (the merged snapshot's parts, the
rollout progress per cluster, ...), and each stage keeps what it derived per cluster,
redoing only the clusters whose input is another object than last time. Finding those
by looking at every cluster cost each stage a loop over the whole fleet on every pass:
at 1000 clusters and one cluster rolling (~20 passes a second), those loops were a
third of the controller's CPU (bench/README.md, issue 33).

So the stage that makes a collection also says what differs from the collection it
made before (:class:`Delta`: the keys whose value is another object, or gone), and a
stage that read exactly that earlier collection (by its generation number) reads only
those keys. Anything else (another producer, a generation skipped, a plain dict or list)
is read whole: a delta is only ever an answer to "what moved since what I last saw".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_generations = itertools.count(1)  # unique in the process: never a dead collection's


@dataclass(frozen=True, slots=True)
class Delta:
    """``keys``: what moved from generation ``base`` (0: none) to generation ``gen``."""

    gen: int
    base: int
    keys: frozenset[Any]

    @classmethod
    def after(cls, before: Delta | None, keys: Iterable[Any]) -> Delta:
        """The delta of a new generation, ``keys`` having moved since ``before``'s (None:
        since nothing known)."""
        return cls(next(_generations), before.gen if before is not None else 0,
                   frozenset(keys))


class DeltaDict(dict[K, V]):
    """A dict (treated as immutable once handed on) and its :class:`Delta`."""

    __slots__ = ("delta",)

    def __init__(self, items: Any, delta: Delta) -> None:
        super().__init__(items)
        self.delta = delta


class DeltaList(list[V]):
    """A list (treated as immutable once handed on) and its :class:`Delta` (by the key
    its producer files each item under); ``lookup(key)``: the items filed under a key
    (empty: gone), None once the producer has moved on from this generation."""

    __slots__ = ("delta", "lookup")

    def __init__(self, items: Iterable[V], delta: Delta,
                 lookup: Callable[[Any], Sequence[V] | None] | None = None) -> None:
        super().__init__(items)
        self.delta = delta
        self.lookup = lookup


def generation(collection: object) -> int:
    """The generation of a delta collection; 0 for anything else."""
    delta = getattr(collection, "delta", None)
    return delta.gen if isinstance(delta, Delta) else 0


def moved_since(collection: object, seen: int) -> AbstractSet[Any] | None:
    """The keys that moved in ``collection`` since generation ``seen`` (what the caller
    last read whole or by delta); None when that cannot be told (read it whole)."""
    delta = getattr(collection, "delta", None)
    if not seen or not isinstance(delta, Delta):
        return None
    if delta.gen == seen:
        return frozenset()
    return delta.keys if delta.base == seen else None
