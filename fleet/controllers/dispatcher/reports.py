"""Actions that only tell people: Events regarding an owner object (rollout halted, not
upgradable in place, version changed by someone else, held for another driver, the
planner's own Events), on its cached copy when there is one.
"""

from __future__ import annotations

from fleet.controllers.dispatcher.core import DispatcherCore
from fleet.events import WARNING
from fleet.planner.actions import (
    HaltObject,
    RecordEvent,
    ReportNotInPlace,
    ReportOtherDriver,
    ReportVersionConflict,
)
from fleet.world.model import ObjectRef


class Reports(DispatcherCore):
    async def _event_on(self, ref: ObjectRef, reason: str, note: str, *, action: str,
                        type: str = WARNING) -> None:
        """An Event regarding the owner object ``ref`` (its cached copy when there is one)."""
        await self.event(self._owner_obj(ref) or ref, reason, note, type=type, action=action)

    async def _do_HaltObject(self, a: HaltObject) -> None:
        await self._event_on(a.owner, "RolloutHalted", a.message, action="Halt")

    async def _do_ReportNotInPlace(self, a: ReportNotInPlace) -> None:
        await self._event_on(a.owner, a.reason, a.message, action="Plan")

    async def _do_RecordEvent(self, a: RecordEvent) -> None:
        await self._event_on(a.regarding, a.reason, a.note, type=a.type, action=a.action)

    async def _do_ReportVersionConflict(self, a: ReportVersionConflict) -> None:
        await self._event_on(a.owner, "VersionChangedByOther", a.message, action="WriteVersion")

    async def _do_ReportOtherDriver(self, a: ReportOtherDriver) -> None:
        await self._event_on(a.owner, a.reason, a.message, action="Hold")
