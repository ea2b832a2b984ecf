"""The worker's path on SQLite: claims, leases, acknowledgements and lease rescue."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from postlane.core.attachments import Attachment
from postlane.core.message import EMAIL, Delivery
from postlane.core.records import Claim, RescueResult, Transition, bound_response
from postlane.core.states import State
from postlane.store import machine
from postlane.store.attachments import SELECT_SQLITE, parts_by_delivery
from postlane.store.base import DELIVERY_COLUMNS
from postlane.store.sqlite._base import (
    _TIME_COLUMNS,
    Q,
    SQLiteEngine,
    _iso,
    _read,
    tolerating_bad_text,
)

# The worker's path: one statement per batch, the batch as one JSON array.
_SET_STATE_IF_SENDING = Q["set_state"].replace("__GUARD__", Q["guard_sending"])
_SET_STATE_IF_AMBIGUOUS = Q["set_state"].replace("__GUARD__", Q["guard_ambiguous"])


class ClaimsMixin(SQLiteEngine):
    def attachments_among(self, ids: Sequence[int]) -> dict[int, tuple[Attachment, ...]]:
        if not ids:
            return {}
        return parts_by_delivery(
            self.conn.execute(SELECT_SQLITE, (json.dumps(list(ids)),)).fetchall())

    # -- the worker's path -----------------------------------------------------------------
    @tolerating_bad_text
    def claim_batch(
        self, lane: str, limit: int, owner: str, lease: timedelta,
        exclude_imports: Sequence[str] = (), channel: str = EMAIL,
    ) -> list[Delivery]:
        excluded = json.dumps(list(exclude_imports))
        with self._write() as conn:
            rows = conn.execute(
                Q["claim"],
                {"owner": owner, "lease_s": lease.total_seconds(), "lane": lane,
                 "channel": channel, "limit": limit, "excluded": excluded},
            ).fetchall()
            rows = conn.execute(Q["claimed_rows"],
                                (json.dumps([r[0] for r in rows]),)).fetchall()
        return [_read(self.conn, r, hinted=True) for r in rows]

    def _guarded_ids(self, sql: str, owner: str, claims: Sequence[Claim],
                     extra: dict[str, Any]) -> set[int]:
        with self._write() as conn:
            rows = conn.execute(sql, {
                "claims": json.dumps([[c.id, c.claims] for c in claims]), "owner": owner,
                **extra}).fetchall()
        return {row[0] for row in rows}

    def start_attempts(self, owner: str, claims: Sequence[Claim]) -> set[int]:
        if not claims:
            return set()
        return self._guarded_ids(Q["start_attempts"], owner, claims, {})

    def renew_leases(self, owner: str, claims: Sequence[Claim], lease: timedelta) -> set[int]:
        if not claims:
            return set()
        return self._guarded_ids(Q["renew_leases"], owner, claims,
                                 {"lease_s": lease.total_seconds()})

    @tolerating_bad_text
    def set_state_if_sending_many(
        self, owner: str, transitions: Sequence[Transition]
    ) -> set[int]:
        if not transitions:
            return set()
        return self._set_state_many(owner, transitions)

    @tolerating_bad_text
    def set_state_if_ambiguous_many(self, transitions: Sequence[Transition]) -> set[int]:
        if not transitions:
            return set()
        return self._set_state_many(None, transitions)

    @tolerating_bad_text
    def list_ambiguous(
        self, limit: int = 100, lanes: Sequence[str] | None = None,
        channel: str | None = None,
    ) -> list[Delivery]:
        rows = self.conn.execute(
            Q["list_ambiguous"],
            {"lanes": None if lanes is None else json.dumps(list(lanes)), "limit": limit,
             "channel": channel},
        ).fetchall()
        return [_read(self.conn, r) for r in rows]

    def _set_state_many(
        self, owner: str | None, transitions: Sequence[Transition]
    ) -> set[int]:
        """Guarded by (sending, owner) when ``owner`` is given, else by ``ambiguous``."""
        sql = _SET_STATE_IF_SENDING if owner is not None else _SET_STATE_IF_AMBIGUOUS
        batch = json.dumps([
            [t.id, t.claims, t.state.value, t.delay_s, 1 if t.spend_attempt else 0,
             bound_response(t.error), t.provider_message_id, t.dead_reason]
            for t in transitions
        ])
        with self._write() as conn:
            claimed_at = dict(conn.execute(sql, {"batch": batch, "owner": owner}).fetchall())
            applied = set(claimed_at)
            done = [t for t in transitions if t.id in applied]
            # A worker's outcome ends its claim, and tells it (0015); settling an ambiguous
            # delivery (no owner) ends none.
            conn.execute(Q["insert_events"], (json.dumps([
                (t.id, t.event, t.state.value, t.detail,
                 *(() if owner is None else (claimed_at[t.id], owner, t.claims)))
                for t in done], default=dict),))
            # After the events: the dead letter's attempt history includes this attempt.
            for t in done:
                if t.state in (State.DEAD, State.EXPIRED):
                    row = conn.execute(Q["delivery_by_id"], (t.id,)).fetchone()
                    self._write_dead_letter(conn, row, t.dead_reason or str(t.state),
                                            t.dead_cause)
        return applied

    def _write_dead_letter(self, conn: sqlite3.Connection, row: Sequence[Any],
                           reason: str, cause: str | None) -> None:
        values = dict(zip(DELIVERY_COLUMNS, row, strict=True))
        snapshot = {k: _kept(k, v) for k, v in values.items()}
        history = machine.attempt_history(
            {"data": json.loads(data), "at": _iso(at)}
            for data, at in conn.execute(Q["attempt_events"], (values["id"],)))
        conn.execute(Q["write_dead_letter"], (
            values["id"], reason, cause, json.dumps(snapshot), values["last_error"],
            json.dumps(history)))

    def rescue_expired_leases(self, limit: int = 1000) -> RescueResult:
        requeued, ambiguous = [], []
        with self._write() as conn:
            ended = []
            for id_, owner, started, claims, claimed_at in conn.execute(
                    Q["expired_leases"], (limit,)).fetchall():
                started = bool(started)
                state = machine.rescue_target(started).value
                attempts = 0
                if started:
                    attempts = conn.execute(Q["rescue_started"], (state, id_)).fetchone()[0]
                    ambiguous.append(id_)
                else:
                    conn.execute(Q["rescue_unstarted"], (state, id_))
                    requeued.append(id_)
                ended.append((id_, machine.RESCUE_EVENT, state,
                              machine.rescue_detail(owner, started, attempts),
                              claimed_at, owner, claims))
            if ended:  # the rescue ends each claim, and tells it (0015)
                conn.execute(Q["insert_events"], (json.dumps(ended),))
        return RescueResult(requeued=sorted(requeued), ambiguous=sorted(ambiguous))


def _kept(column: str, value: Any) -> Any:
    """A column as a dead-letter snapshot keeps it. One that cannot be read (a poison
    row's time past year 9999, its broken JSON) is kept as stored: its entry is written
    all the same, and the acknowledgements written with it are not held up."""
    try:
        if isinstance(value, UnicodeDecodeError):  # read while tolerating bad text
            return value.object.decode(errors="replace")
        if column in _TIME_COLUMNS:
            return _iso(value)
        if column in ("headers", "metadata"):
            return json.loads(value)
    except (ValueError, TypeError, OverflowError):
        return value
    return value
