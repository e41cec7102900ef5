"""What the controller consults besides the snapshot: the fleet policy, as a declared
protocol (implemented by the rollout's waves gate and by the runtime extension's
exclusion, which wraps it). Given to the controller when it is built."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Protocol, runtime_checkable

from fleet.world.model import ClusterKey, ObjectRef, Snapshot

# hold(cluster, owner): a reason to start no new node upgrade for that object now (waves,
# windows, pauses, another path driving the cluster), or None.
Hold = Callable[[ClusterKey, ObjectRef], "str | None"]


@runtime_checkable
class VerdictHold(Protocol):
    """A hold that can say cheaply whether its answers for a cluster moved: two verdicts
    of a cluster that compare equal (from this hold or an earlier one of the same kind)
    mean the same answer for every owner in that cluster. The incremental planner then
    asks again only the clusters whose verdict changed."""

    def __call__(self, cluster: ClusterKey, owner: ObjectRef) -> str | None: ...

    def verdict(self, cluster: ClusterKey) -> object: ...


@runtime_checkable
class DiffableHold(VerdictHold, Protocol):
    """A verdict hold that can also name the clusters whose verdict may have moved since
    an earlier hold: the incremental planner then looks at those only, not at every
    cluster of the fleet on every pass."""

    def moved_since(self, before: object) -> AbstractSet[ClusterKey] | None:
        """The clusters whose verdict may differ from ``before``'s (None: any may)."""
        ...


class FleetPolicy(Protocol):
    """Consulted before and told after each planning pass."""

    async def __call__(self, snapshot: Snapshot) -> Hold | None:
        """The hold for this pass (None: hold nothing)."""
        ...

    @property
    def stopped(self) -> bool:
        """Emergency stop in force: besides holding new starts, the controller must not
        start or signal NodePlans already created (as for ``rollout.emergencyStop``)."""
        ...

    def on_pass(self, snapshot: Snapshot) -> None:
        """What the pass decided on (metrics)."""
        ...
