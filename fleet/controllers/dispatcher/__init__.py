"""Act: perform the planner's actions against the API servers, idempotently.

Every write is either a create (AlreadyExists = someone did it already) or a
``patch_with_retry`` whose mutation re-checks, on the freshest object, that the change
is still wanted: performing an action twice, or after another controller did, changes
nothing. Whatever a write returns goes into the caches at once (write-through), so the
next planning pass sees it even before the watch does.

One :class:`Dispatcher`, its writes in parts by what they write: :mod:`.core` (the
write-through patch, Events, ``perform``), :mod:`.nodeplans` (the NodePlan's life),
:mod:`.nodes` (the request on a workload cluster's node, our cordon),
:mod:`.owners` (versions, pauses and status on Cluster API objects), :mod:`.reports`
(actions that only record an Event); :mod:`.targets` orders the actions.
"""

from __future__ import annotations

from fleet.controllers.dispatcher.core import DispatchStats
from fleet.controllers.dispatcher.nodeplans import NodePlanWrites
from fleet.controllers.dispatcher.owners import OwnerWrites
from fleet.controllers.dispatcher.reports import Reports
from fleet.controllers.dispatcher.targets import action_target

__all__ = ["DispatchStats", "Dispatcher", "action_target"]


class Dispatcher(NodePlanWrites, OwnerWrites, Reports):
    """Performs the planner's actions: :meth:`perform` calls ``_do_<Action>`` of the part
    that writes what the action is about."""
