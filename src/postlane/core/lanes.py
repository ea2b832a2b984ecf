"""Lanes: reserved shares of the worker's send slots, lent when idle, never taken.

A lane owns a floor of ``share * concurrency`` slots. A lane with work may borrow the idle
slots of another only while that lane has no ready work; the moment the owner's work
arrives, no new borrowed send starts, so a bulk burst cannot hold the slots a password
reset needs, and a trickle of urgent mail cannot starve the bulk lane below its floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from postlane.errors import ConfigurationError

AmbiguityPolicy = Literal["hold", "resend"]


@dataclass(frozen=True, slots=True)
class LaneConfig:
    name: str
    share: float
    """Fraction of the worker's slots this lane owns (0 < share <= 1)."""
    max_attempts: int = 8
    default_expiry: timedelta | None = None
    """Applied at enqueue when a message brings no expiry of its own."""
    on_ambiguous: AmbiguityPolicy = "hold"
    """When the provider may have accepted and can neither deduplicate nor be asked:
    ``hold`` parks the delivery for an operator; ``resend`` accepts a possible duplicate."""


DEFAULT_LANES: tuple[LaneConfig, ...] = (
    LaneConfig("interactive", 0.7, max_attempts=6, default_expiry=timedelta(minutes=15)),
    LaneConfig("bulk", 0.3, max_attempts=8, default_expiry=timedelta(hours=24)),
)


def parse_lane_shares(text: str, base: Sequence[LaneConfig] = DEFAULT_LANES) -> list[LaneConfig]:
    """``interactive=70,bulk=30`` -> lane configs (percentages must add up to 100)."""
    by_name = {lane.name: lane for lane in base}
    lanes = []
    for part in text.split(","):
        name, sep, pct = part.strip().partition("=")
        if not sep or not name:
            raise ConfigurationError(f"lane share {part!r} is not NAME=PERCENT")
        try:
            value = float(pct)
        except ValueError:
            raise ConfigurationError(f"lane share {part!r}: {pct!r} is not a number") from None
        if not 0 < value <= 100:
            raise ConfigurationError(f"lane share {part!r} must be in (0, 100]")
        template = by_name.get(name, LaneConfig(name, 0.0))
        lanes.append(LaneConfig(name, value / 100, template.max_attempts,
                                template.default_expiry, template.on_ambiguous))
    check_lanes(lanes)
    return lanes


def check_lanes(lanes: Sequence[LaneConfig]) -> None:
    names = [lane.name for lane in lanes]
    if not lanes:
        raise ConfigurationError("at least one lane is needed")
    if len(set(names)) != len(names):
        raise ConfigurationError(f"lane names repeat: {names}")
    total = sum(lane.share for lane in lanes)
    if abs(total - 1.0) > 1e-6:
        raise ConfigurationError(
            f"lane shares add up to {total * 100:.0f}%, not 100% ({', '.join(names)})"
        )
    for lane in lanes:
        if lane.max_attempts < 1:
            raise ConfigurationError(f"lane {lane.name}: max_attempts must be at least 1")


def slot_floors(lanes: Sequence[LaneConfig], concurrency: int) -> dict[str, int]:
    """Each lane's reserved slots; every lane gets at least one, the total is ``concurrency``."""
    if concurrency < len(lanes):
        raise ConfigurationError(
            f"concurrency {concurrency} is below the number of lanes ({len(lanes)})"
        )
    floors = {lane.name: max(1, int(lane.share * concurrency)) for lane in lanes}
    # Hand out (or take back) the rounding remainder, largest share first.
    ordered = sorted(lanes, key=lambda lane: -lane.share)
    i = 0
    while sum(floors.values()) != concurrency:
        name = ordered[i % len(ordered)].name
        if sum(floors.values()) < concurrency:
            floors[name] += 1
        elif floors[name] > 1:
            floors[name] -= 1
        i += 1
    return floors


def may_start(
    lane: str,
    in_flight: Mapping[str, int],
    floors: Mapping[str, int],
    wanting: Mapping[str, bool],
) -> bool:
    """Whether ``lane`` may start one more send now.

    Within its floor, always. Beyond it, only into a slot of a lane that neither uses it
    nor has work waiting (``wanting``), so a lender gets its floor back at its next send.
    """
    if in_flight.get(lane, 0) < floors[lane]:
        return True
    spare = 0
    for other, floor in floors.items():
        if other == lane:
            continue
        # A slot already lent to a third lane is not idle: it cannot be lent twice.
        spare -= max(0, in_flight.get(other, 0) - floor)
        if wanting.get(other, False):
            continue
        spare += max(0, floor - in_flight.get(other, 0))
    borrowed = in_flight.get(lane, 0) - floors[lane]
    return borrowed < spare
