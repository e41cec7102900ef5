"""Which replica owns which shard, and what the group's Leases are called: pure (no I/O).

Clusters are hashed into a fixed number of shards (:func:`shard_of`); each shard goes to
one live replica by rendezvous hashing (:func:`rendezvous_owner`), so a replica joining or
leaving moves only its own share. The claim and member Leases of a group are named and
labelled here (fleet.controllers.shard has the protocol that uses them).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from fleet.world.model import ClusterKey, format_time

GROUP_LABEL = "fleet.k0s-fleet.io/lease-group"
ROLE_LABEL = "fleet.k0s-fleet.io/lease-role"
SHARDS_ANNOTATION = "fleet.k0s-fleet.io/shards"
REPLICA, SHARD = "replica", "shard"


def shard_of(cluster: ClusterKey, shards: int) -> int:
    """The shard of a cluster: a stable hash of "namespace/name" modulo ``shards``."""
    digest = hashlib.sha256(f"{cluster[0]}/{cluster[1]}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def _weight(item: str, member: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{member}\x00{item}".encode()).digest()[:8], "big")


def rendezvous_owner(item: str, members: Iterable[str]) -> str | None:
    """Highest-random-weight owner of ``item`` among ``members`` (None when empty).

    Every replica computes the same answer from the same member set; removing a member
    moves only the items it owned, adding one moves only the items it now wins.
    """
    best: tuple[int, str] | None = None
    for m in members:
        w = (_weight(item, m), m)
        if best is None or w > best:
            best = w
    return None if best is None else best[1]


def assignment(shards: int, members: Sequence[str]) -> dict[int, str]:
    """Shard -> owning member, for every shard (empty when there is no member)."""
    if not members:
        return {}
    return {s: owner for s in range(shards)
            if (owner := rendezvous_owner(str(s), members)) is not None}


_INVALID = re.compile(r"[^a-z0-9-]+")


def member_lease_name(group: str, identity: str) -> str:
    slug = _INVALID.sub("-", identity.lower()).strip("-") or "replica"
    name = f"{group}-replica-{slug}"
    if len(name) > 253 or slug != identity:
        # Keep names valid and distinct: a digest of the identity disambiguates.
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        name = f"{group}-replica-{slug[:200]}-{digest}"
    return name


def shard_lease_name(group: str, shard: int) -> str:
    return f"{group}-shard-{shard}"


def lease_now() -> str:
    """Now, as a Lease's renewTime / acquireTime."""
    return format_time(datetime.now(UTC))

