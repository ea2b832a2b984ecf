"""Fleet controls: operator pauses and breaker records, stored so every worker obeys.

Workers re-read them every ``controls_interval_s`` (half a second by default), so a pause
takes effect on every host within a second. A pause stops claims; it never deletes work.
"""

from __future__ import annotations

from postlane.core.breaker import CONTROL_PREFIX as BREAKER_PREFIX
from postlane.core.records import Control
from postlane.store.roles import FleetStore

LANE_PAUSE = "pause:lane:"
IMPORT_PAUSE = "pause:import:"


async def pause_lane(store: FleetStore, lane: str, *, by: str = "operator") -> None:
    await store.set_control(LANE_PAUSE + lane, {"by": by})


async def resume_lane(store: FleetStore, lane: str) -> None:
    await store.set_control(LANE_PAUSE + lane, None)


async def pause_import(store: FleetStore, import_id: str, *, by: str = "operator",
                       reason: str | None = None) -> None:
    value = {"by": by} if reason is None else {"by": by, "reason": reason}
    await store.set_control(IMPORT_PAUSE + import_id, value)


async def resume_import(store: FleetStore, import_id: str) -> None:
    await store.set_control(IMPORT_PAUSE + import_id, None)


class FleetControls:
    """The worker's copy of the control table, refreshed by its caretaker."""

    def __init__(self, store: FleetStore) -> None:
        self.store = store
        self._controls: dict[str, Control] = {}
        self.paused_lanes: frozenset[str] = frozenset()
        self.paused_imports: tuple[str, ...] = ()

    async def refresh(self) -> None:
        self._controls = await self.store.get_controls()
        self.paused_lanes = frozenset(
            name[len(LANE_PAUSE):] for name in self._controls if name.startswith(LANE_PAUSE)
        )
        self.paused_imports = tuple(sorted(
            name[len(IMPORT_PAUSE):] for name in self._controls if name.startswith(IMPORT_PAUSE)
        ))

    def lane_paused(self, lane: str) -> bool:
        return lane in self.paused_lanes

    def breaker(self, account: str) -> Control | None:
        return self._controls.get(BREAKER_PREFIX + account)
