"""The pure parts of taking over a shard another replica held (sharded replicas).

Before a replica acts on the clusters of a shard it has just taken, it reads their
objects again in full (they were kept foreign, fleet/kept.py) and makes sure its
NodePlan cache holds what the previous holder dispatched. The I/O is
:meth:`fleet.controllers.runner.FleetController.warm_taken`; what it keeps and decides
is here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.model import ClusterKey

# Where one list of a bulk re-read stands: (namespace or None, resource plural).
ListAt = tuple[str | None, str]


def plans_not_cached(listed: Iterable[Mapping[str, Any]], cached: Callable[[str, str], bool],
                     taken: Callable[[ClusterKey], bool] | None = None) -> list[str]:
    """The listed NodePlans the cache does not hold yet (``cached(name, namespace)``),
    counting with ``taken`` only those of the clusters it names: what a replica that
    stopped dispatched for the shards just taken. The other replicas' clusters go on
    getting NodePlans while a fleet rolls, so a list of every NodePlan nearly always
    holds one the watch has not delivered yet: a taken shard waited for a quiet moment
    (minutes: 305-361 s in a 10 x 300 roll with one replica killed)."""
    missing: list[str] = []
    for p in listed:
        meta = p.get("metadata") or {}
        name, ns = str(meta.get("name") or ""), str(meta.get("namespace") or "")
        if taken is not None and \
                not taken((ns, str((p.get("spec") or {}).get("clusterName") or ""))):
            continue
        if not cached(name, ns):
            missing.append(f"{ns}/{name}")
    return missing


@dataclass
class BulkReread:
    """How far one re-read of every Machine and Secret has come: the clusters it is for,
    and per list the next page's continue token (None once that list was read to its
    end). A call cut off part-way (the claims task bounds each one to a fraction of the
    lease; 20 pages of Machines under load take longer) goes on from here."""

    clusters: frozenset[ClusterKey] = frozenset()
    next_page: dict[ListAt, str | None] = field(default_factory=dict)

    def start(self, clusters: frozenset[ClusterKey]) -> None:
        """Read for ``clusters``: what was read goes on counting when they are the same
        clusters or fewer; for any other, every list starts from its first page."""
        if not clusters <= self.clusters:
            self.reset(clusters)

    def reset(self, clusters: frozenset[ClusterKey] = frozenset()) -> None:
        """Forget every page read (a shard given back, or the re-read finished)."""
        self.clusters, self.next_page = clusters, {}

    def finished(self, at: ListAt) -> bool:
        return at in self.next_page and self.next_page[at] is None

    def resume_from(self, at: ListAt) -> str | None:
        """The continue token to resume ``at`` from (None: its first page)."""
        return self.next_page.get(at)

    def read(self, at: ListAt, continue_token: str | None) -> None:
        """A page of ``at`` was read; ``continue_token`` is the next one (None: the end)."""
        self.next_page[at] = continue_token

    def restart(self, at: ListAt) -> None:
        """``at`` again from its first page (the server no longer keeps its snapshot)."""
        self.next_page.pop(at, None)
