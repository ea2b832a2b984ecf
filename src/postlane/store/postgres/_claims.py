"""The worker's path: claim deliveries under a lease, start and renew attempts, report their
outcomes, settle ambiguous ones, and rescue the leases of workers that went away."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from postlane.core.attachments import Attachment
from postlane.core.message import EMAIL, Delivery
from postlane.core.records import Claim, RescueResult, Transition, bound_response
from postlane.core.states import State
from postlane.store.attachments import SELECT_PG, parts_by_delivery
from postlane.store.postgres._base import PostgresBase, Q, _deliveries

_SET_STATE_IF_SENDING = Q["set_state"].replace("__GUARD__", Q["guard_leased_to_me"])
_SET_STATE_IF_AMBIGUOUS = Q["set_state"].replace("__GUARD__", Q["guard_ambiguous"])


def _array(numbers: Iterable[int]) -> str:
    """Integers as a PostgreSQL array literal, for a parameter the statement casts."""
    return "{" + ",".join(map(str, numbers)) + "}"


class ClaimsMixin(PostgresBase):
    async def attachments_among(self, ids: Sequence[int]) -> dict[int, tuple[Attachment, ...]]:
        if not ids:
            return {}
        async with self._pool.connection() as conn:
            # Binary results: bytea as its bytes, not as hex text twice their size to send
            # and to parse.
            cur = await conn.execute(SELECT_PG, (list(ids),), binary=True)
            return parts_by_delivery(await cur.fetchall())

    # -- the worker's path -----------------------------------------------------------------
    async def claim_batch(
        self, lane: str, limit: int, owner: str, lease: timedelta,
        exclude_imports: Sequence[str] = (), channel: str = EMAIL,
    ) -> list[Delivery]:
        params = {"lane": lane, "channel": channel, "limit": limit, "owner": owner,
                  "lease_s": lease.total_seconds(), "exclude_imports": list(exclude_imports)}
        async with self._pool.connection() as conn:
            # Prepared as any statement (psycopg's threshold): planning it cost half a
            # millisecond a batch, and its generic plan is as good as a custom one (see the
            # statement).
            cur = await conn.execute(Q["claim"], params)
            return await _deliveries(cur, hinted=True)

    async def start_attempts(self, owner: str, claims: Sequence[Claim]) -> set[int]:
        return await self._ids(Q["start_attempts"], owner, claims, {})

    async def renew_leases(
        self, owner: str, claims: Sequence[Claim], lease: timedelta
    ) -> set[int]:
        return await self._ids(Q["renew_leases"], owner, claims, {"lease_s": lease.total_seconds()})

    async def _ids(
        self, sql: str, owner: str, claims: Sequence[Claim], extra: dict[str, Any]
    ) -> set[int]:
        if not claims:
            return set()
        # The arrays as literals ('{1,2,3}', cast by the statement): psycopg's list dumper
        # costs more than the rest of the statement's client time.
        params = {"owner": owner, "ids": _array(c.id for c in claims),
                  "claims": _array(c.claims for c in claims), **extra}
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            return {row[0] for row in await cur.fetchall()}

    async def set_state_if_sending_many(
        self, owner: str, transitions: Sequence[Transition]
    ) -> set[int]:
        return await self._set_state_many(_SET_STATE_IF_SENDING, owner, transitions)

    async def set_state_if_ambiguous_many(self, transitions: Sequence[Transition]) -> set[int]:
        return await self._set_state_many(_SET_STATE_IF_AMBIGUOUS, None, transitions)

    async def _set_state_many(
        self, sql: str, owner: str | None, transitions: Sequence[Transition]
    ) -> set[int]:
        if not transitions:
            return set()
        batch = [
            [t.id, t.claims, t.state.value, t.delay_s, 1 if t.spend_attempt else 0,
             bound_response(t.error), t.provider_message_id, t.dead_reason, t.dead_cause,
             t.event, t.detail]
            for t in transitions
        ]
        # default=dict: a detail that is a Mapping but not a dict.
        params = {"owner": owner, "batch": json.dumps(batch, default=dict)}
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            return {row[0] for row in await cur.fetchall()}

    async def list_ambiguous(
        self, limit: int = 100, lanes: Sequence[str] | None = None,
        channel: str | None = None,
    ) -> list[Delivery]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                Q["list_ambiguous"],
                (None if lanes is None else list(lanes), None if lanes is None else list(lanes),
                 channel, channel, limit),
            )
            return await _deliveries(cur)

    async def rescue_expired_leases(self, limit: int = 1000) -> RescueResult:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["rescue"], {"limit": limit})
            rows = await cur.fetchall()
        return RescueResult(
            requeued=sorted(r[0] for r in rows if r[1] == State.PENDING),
            ambiguous=sorted(r[0] for r in rows if r[1] == State.AMBIGUOUS),
        )
