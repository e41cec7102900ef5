"""The pure part of taking over a shard another replica held (sharded replicas).

Before a replica acts on the clusters of a shard it has just taken, it reads their
NodePlans (what the previous holder dispatched) and the objects kept foreign until then
(fleet/world/kept.py) again. The I/O is
:meth:`fleet.controllers.takeover.ShardTakeover.warm_taken`; the progress of its bulk
re-read, kept across looks that are cut off, is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.world.model import ClusterKey

# Where one list of a bulk re-read stands: (namespace or None, resource plural).
ListAt = tuple[str | None, str]


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
