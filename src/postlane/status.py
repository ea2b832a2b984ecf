"""The fleet's status in one reading: the four numbers, pauses and breakers.

``postlane status``, ``GET /v1/status``, the dashboard and the metrics scrape all show this
one object, so they cannot disagree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from postlane.core.breaker import CONTROL_PREFIX as BREAKER_PREFIX
from postlane.core.deliverability import BOUNCE_RATE_LIMIT, COMPLAINT_RATE_LIMIT
from postlane.core.records import ChannelStats, Control, LaneDeliverability, Stats
from postlane.store.roles import FleetStore
from postlane.worker.controls import IMPORT_PAUSE, LANE_PAUSE


@dataclass(frozen=True, slots=True)
class FleetStatus:
    """One reading of the store: the four numbers plus pauses and breakers."""

    stats: Stats
    controls: dict[str, Control]
    taken_at: float
    """Unix time of the reading."""
    query_s: float
    """How long the queries took."""
    deliverability: dict[str, LaneDeliverability] = field(default_factory=dict)
    """Per lane, what came back over the last ``DELIVERABILITY_WINDOW``."""
    provider_events: dict[tuple[str, str], int] = field(default_factory=dict)
    """Provider events kept, by (kind, lane)."""
    channels: ChannelStats = field(default_factory=lambda: ChannelStats({}, {}))
    """Pending by channel and SMS fallbacks by trigger."""

    @property
    def paused_lanes(self) -> list[str]:
        return sorted(n.removeprefix(LANE_PAUSE) for n in self.controls
                      if n.startswith(LANE_PAUSE))

    @property
    def paused_imports(self) -> list[str]:
        return sorted(n.removeprefix(IMPORT_PAUSE) for n in self.controls
                      if n.startswith(IMPORT_PAUSE))

    @property
    def breakers(self) -> dict[str, dict[str, Any]]:
        return {n.removeprefix(BREAKER_PREFIX): c.value for n, c in self.controls.items()
                if n.startswith(BREAKER_PREFIX)}

    def as_json(self) -> dict[str, Any]:
        """Exactly what ``postlane status --json`` prints."""
        data = self.stats.as_json()
        data["paused_lanes"] = self.paused_lanes
        data["paused_imports"] = self.paused_imports
        data["breakers"] = self.breakers
        data["deliverability"] = {
            "window_s": DELIVERABILITY_WINDOW.total_seconds(),
            "bounce_rate_limit": BOUNCE_RATE_LIMIT,
            "complaint_rate_limit": COMPLAINT_RATE_LIMIT,
            "lanes": {name: lane.as_json()
                      for name, lane in sorted(self.deliverability.items())},
        }
        data.update(self.channels.as_json())
        return data


def breaker_reason(record: dict[str, Any]) -> str:
    """Why a breaker is open, in one line: its reason, plus the account trouble it met when
    the reason no longer says so ("probe abandoned")."""
    why, cause = str(record.get("reason", "")), str(record.get("cause", ""))
    if cause and cause not in why:
        why = f"{why}; account trouble: {cause}"
    return why


DELIVERABILITY_WINDOW = timedelta(hours=24)
"""Bounce and complaint rates are over the last day: what a provider's dashboard shows."""


async def fleet_status(store: FleetStore) -> FleetStatus:
    """Read the four numbers, the controls, the deliverability figures and the channels
    (nine queries; see ``postlane.metrics``)."""
    started = time.perf_counter()
    stats = await store.stats()
    controls = await store.get_controls()
    deliverability = await store.deliverability(DELIVERABILITY_WINDOW)
    totals = await store.provider_event_totals()
    channels = await store.channel_stats()
    return FleetStatus(stats, controls, time.time(), time.perf_counter() - started,
                       deliverability, totals, channels)
