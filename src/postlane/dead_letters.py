"""Dead-letter operations: triage, staged replay, discard.

Replay is a deliberate, staged operation, never a flush (see the dead-letter seed text):

1. *Still useful?* A delivery past its expiry, or past a validity window given at replay
   time, is refused; it can only be discarded.
2. *Cause fixed?* A selection is replayed only after one of its entries (the canary) was
   replayed and has been sent.
3. *Key preserved.* The same row is sent again: same idempotency key, same rendered
   content, through the same lanes and limiter as any other send.

A bulk replay never takes an entry that was replayed before, so a replay loop cannot
flood the provider; a re-dead entry stays one entry, with its replay count.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from postlane.core.records import DeadLetter, DeadLetterFilter
from postlane.errors import ReplayRefused
from postlane.store.roles import OperatorStore


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    replay: list[int] = field(default_factory=list)
    """Entries replayed (or, in a dry run, that would be)."""
    skipped_expired: list[int] = field(default_factory=list)
    canary: int | None = None
    dry_run: bool = False


def not_useful_because(entry: DeadLetter, now: datetime,
                       valid_for: timedelta | None = None) -> str | None:
    """Why replaying ``entry`` would deliver something useless, or None if it is still useful."""
    snapshot = entry.snapshot
    expires_at = _time(snapshot.get("expires_at"))
    if expires_at is not None and now >= expires_at:
        return f"expired at {expires_at.isoformat()}; discard it instead"
    created_at = _time(snapshot.get("created_at"))
    if valid_for is not None and created_at is not None and now - created_at > valid_for:
        return (f"older than the validity window ({valid_for}) given for this replay; "
                "discard it instead")
    return None


async def replay_one(store: OperatorStore, delivery_id: int, *, by: str,
                     valid_for: timedelta | None = None,
                     now: datetime | None = None, dry_run: bool = False) -> DeadLetter:
    """Replay a single entry (the canary of a selection, or a one-off fix). ``dry_run``
    runs every check (refusing as a replay would) and replays nothing."""
    entry = await store.dead_letter(delivery_id)
    if entry is None:
        raise ReplayRefused(f"no dead letter for delivery {delivery_id}")
    if entry.discarded_at is not None:
        raise ReplayRefused(f"dead letter {delivery_id} was discarded ({entry.discard_reason})")
    if entry.delivery_state not in ("dead", "expired"):
        raise ReplayRefused(
            f"delivery {delivery_id} is {entry.delivery_state}, not dead: nothing to replay"
        )
    why = not_useful_because(entry, now or datetime.now(UTC), valid_for)
    if why:
        raise ReplayRefused(f"delivery {delivery_id} is no longer useful: {why}")
    if dry_run:
        return entry
    if delivery_id not in await store.replay_dead_letters([delivery_id], by):
        raise ReplayRefused(f"delivery {delivery_id} changed while replaying; look again")
    return entry


async def replay_selection(
    store: OperatorStore, selection: DeadLetterFilter, *, by: str, dry_run: bool = False,
    valid_for: timedelta | None = None, limit: int = 1000, now: datetime | None = None,
) -> ReplayPlan:
    """Replay the rest of a selection once its canary has been sent."""
    now = now or datetime.now(UTC)
    canary = await _sent_canary(store, selection)
    candidates = await store.list_dead_letters(
        replace(selection, replayed=False, include_closed=False), limit=limit
    )
    useful: list[int] = []
    expired: list[int] = []
    for entry in candidates:
        (expired if not_useful_because(entry, now, valid_for) else useful).append(
            entry.delivery_id
        )
    # Ids in ascending order either way, so a dry run lists exactly what the real run
    # would report (dead letters list newest first, and two may share a dead time).
    if dry_run:
        return ReplayPlan(sorted(useful), sorted(expired), canary, dry_run=True)
    replayed = await store.replay_dead_letters(useful, by) if useful else set()
    return ReplayPlan(sorted(replayed), sorted(expired), canary)


async def _sent_canary(store: OperatorStore, selection: DeadLetterFilter) -> int:
    tried = await store.list_dead_letters(
        replace(selection, replayed=True, include_closed=True), limit=1000
    )
    for entry in tried:
        if entry.delivery_state == "sent":
            return entry.delivery_id
    if tried:
        states = ", ".join(f"{e.delivery_id}: {e.delivery_state}" for e in tried[:5])
        raise ReplayRefused(f"the canary has not been sent yet ({states}); wait for it, "
                            "or find out why it failed again")
    first = await store.list_dead_letters(replace(selection, replayed=False), limit=1)
    hint = f" (e.g. `postlane dlq replay {first[0].delivery_id}`)" if first else ""
    raise ReplayRefused("replay one entry of this selection first and wait until it is sent"
                        f"{hint}; then replay the rest")


def _time(value: object) -> datetime | None:
    """A snapshot's time; None also for one Python cannot hold (a poison row's year 10000
    or ``infinity``: no end of usefulness that a replay could miss)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
