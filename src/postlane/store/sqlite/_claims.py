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
from postlane.store.attachments import SELECT_SQLITE, parts_by_delivery
from postlane.store.base import DELIVERY_COLUMNS
from postlane.store.sqlite._base import (
    _COLS,
    _INSERT_EVENT,
    _TERMINAL,
    _TIME_COLUMNS,
    NOW,
    ROWS,
    SQLiteEngine,
    _iso,
    _read,
    tolerating_bad_text,
)

# -- the worker's path: one statement per batch, the batch as one JSON array -------------
# Guarded as on PostgreSQL: leased to me (claim number and owner), lease not yet expired.
_CLAIMS = """(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims
             FROM json_each(:claims)) AS t"""
_LEASED_TO_ME = (
    f"d.id = t.id AND d.claims = t.claims AND d.state = 'sending' "
    f"AND d.lease_owner = :owner AND d.lease_expires_at > {NOW}"
)
_START = f"""
UPDATE postlane_deliveries AS d SET attempt_started_at = {NOW}, updated_at = {NOW}
FROM {_CLAIMS} WHERE {_LEASED_TO_ME}
RETURNING id
"""
_RENEW = f"""
UPDATE postlane_deliveries AS d SET lease_expires_at = {NOW} + :lease_s, updated_at = {NOW}
FROM {_CLAIMS} WHERE {_LEASED_TO_ME}
RETURNING id
"""
_SET_STATE_TEMPLATE = f"""
UPDATE postlane_deliveries AS d SET
    state = t.state,
    attempts = d.attempts + t.spend,
    run_at = CASE WHEN t.state = 'pending'
                  THEN {NOW} + COALESCE(t.delay_s, 0) ELSE d.run_at END,
    lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
    last_error = COALESCE(t.error, d.last_error),
    provider_message_id = COALESCE(t.pmid, d.provider_message_id),
    dead_reason = CASE WHEN t.state = 'dead' THEN t.reason ELSE d.dead_reason END,
    sent_at = CASE WHEN t.state = 'sent' THEN {NOW} ELSE d.sent_at END,
    finished_at = CASE WHEN t.state IN {_TERMINAL} THEN {NOW} ELSE NULL END,
    updated_at = {NOW}
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS claims,
             json_extract(value, '$[2]') AS state, json_extract(value, '$[3]') AS delay_s,
             json_extract(value, '$[4]') AS spend, json_extract(value, '$[5]') AS error,
             json_extract(value, '$[6]') AS pmid, json_extract(value, '$[7]') AS reason
      FROM json_each(:batch)) AS t
WHERE d.id = t.id AND d.claims = t.claims AND __GUARD__
RETURNING id
"""
_SET_STATE_IF_SENDING = _SET_STATE_TEMPLATE.replace(
    "__GUARD__", "d.state = 'sending' AND d.lease_owner = :owner")
_SET_STATE_IF_AMBIGUOUS = _SET_STATE_TEMPLATE.replace("__GUARD__", "d.state = 'ambiguous'")
# A batch's events in one statement, from one JSON array of [delivery id, kind, state,
# detail] (an executemany with a json.dumps per row cost more than the update it follows).
_INSERT_EVENTS = f"""
INSERT INTO postlane_events (delivery_id, at, kind, state, data)
SELECT json_extract(value, '$[0]'), {NOW}, json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json(json_extract(value, '$[3]'))
FROM json_each(?)
"""


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
                f"""
                UPDATE postlane_deliveries
                SET state = 'sending', lease_owner = :owner,
                    lease_expires_at = {NOW} + :lease_s, claims = claims + 1,
                    attempt_started_at = NULL, updated_at = {NOW}
                WHERE id IN (
                    SELECT id FROM postlane_deliveries
                    WHERE state = 'pending' AND lane = :lane AND channel = :channel
                      AND run_at <= {NOW}
                      AND (import_id IS NULL OR import_id NOT IN
                           (SELECT value FROM json_each(:excluded)))
                    ORDER BY run_at, id LIMIT :limit)
                RETURNING id, claims
                """,
                {"owner": owner, "lease_s": lease.total_seconds(), "lane": lane,
                 "channel": channel, "limit": limit, "excluded": excluded},
            ).fetchall()
            conn.execute(_INSERT_EVENTS, (json.dumps([
                (id_, "claimed", "sending", {"owner": owner, "claim": claims})
                for id_, claims in rows]),))
            # The update rewrote only the narrow rows; the messages are read here.
            rows = conn.execute(
                f"SELECT {_COLS} FROM {ROWS} WHERE id IN "
                "(SELECT value FROM json_each(?)) ORDER BY run_at, id",
                (json.dumps([r[0] for r in rows]),)).fetchall()
        return [_read(self.conn, r) for r in rows]

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
        return self._guarded_ids(_START, owner, claims, {})

    def renew_leases(self, owner: str, claims: Sequence[Claim], lease: timedelta) -> set[int]:
        if not claims:
            return set()
        return self._guarded_ids(_RENEW, owner, claims, {"lease_s": lease.total_seconds()})

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
            f"SELECT {_COLS} FROM {ROWS} WHERE state = 'ambiguous' "
            "AND (:lanes IS NULL OR lane IN (SELECT value FROM json_each(:lanes))) "
            "AND (:channel IS NULL OR channel = :channel) "
            "ORDER BY updated_at, id LIMIT :limit",
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
            applied = {row[0] for row in conn.execute(sql, {"batch": batch, "owner": owner})}
            done = [t for t in transitions if t.id in applied]
            conn.execute(_INSERT_EVENTS, (json.dumps([
                (t.id, t.event, t.state.value, t.detail) for t in done], default=dict),))
            # After the events: the dead letter's attempt history includes this attempt.
            for t in done:
                if t.state in (State.DEAD, State.EXPIRED):
                    row = conn.execute(
                        f"SELECT {_COLS} FROM {ROWS} WHERE id = ?", (t.id,)
                    ).fetchone()
                    self._write_dead_letter(conn, row, t.dead_reason or str(t.state),
                                            t.dead_cause)
        return applied

    def _write_dead_letter(self, conn: sqlite3.Connection, row: Sequence[Any],
                           reason: str, cause: str | None) -> None:
        values = dict(zip(DELIVERY_COLUMNS, row, strict=True))
        snapshot = {k: _kept(k, v) for k, v in values.items()}
        history = [
            {**json.loads(data), "at": _iso(at)}
            for data, at in conn.execute(
                "SELECT data, at FROM postlane_events WHERE delivery_id = ? "
                "AND json_extract(data, '$.outcome') IS NOT NULL ORDER BY id", (values["id"],))
        ]
        conn.execute(
            f"""
            INSERT INTO postlane_dead_letters
                (delivery_id, reason, cause, snapshot, last_response, attempt_history,
                 dead_at)
            VALUES (?, ?, ?, ?, ?, ?, {NOW})
            ON CONFLICT (delivery_id) DO UPDATE SET
                reason = excluded.reason, cause = excluded.cause, snapshot = excluded.snapshot,
                last_response = excluded.last_response,
                attempt_history = excluded.attempt_history, dead_at = excluded.dead_at,
                discarded_at = NULL, discard_reason = NULL
            """,
            (values["id"], reason, cause, json.dumps(snapshot), values["last_error"],
             json.dumps(history)),
        )

    def rescue_expired_leases(self, limit: int = 1000) -> RescueResult:
        requeued, ambiguous = [], []
        with self._write() as conn:
            rows = conn.execute(
                f"SELECT id, lease_owner, attempt_started_at IS NOT NULL "
                f"FROM postlane_deliveries WHERE state = 'sending' "
                f"AND lease_expires_at < {NOW} ORDER BY lease_expires_at LIMIT ?", (limit,)
            ).fetchall()
            for id_, owner, started in rows:
                detail: dict[str, Any] = {"owner": owner, "attempt_started": bool(started)}
                if started:
                    attempts = conn.execute(
                        f"UPDATE postlane_deliveries SET state = 'ambiguous', "
                        f"attempts = attempts + 1, last_error = ?, lease_owner = NULL, "
                        f"lease_expires_at = NULL, attempt_started_at = NULL, "
                        f"updated_at = {NOW} WHERE id = ? RETURNING attempts",
                        ("lease expired after the attempt started; the provider may have "
                         "accepted it", id_),
                    ).fetchone()[0]
                    # Part of the attempt history, as an ambiguous attempt.
                    detail.update(outcome="ambiguous", attempt=attempts,
                                  response="lease expired after the attempt started")
                    ambiguous.append(id_)
                else:
                    conn.execute(
                        f"UPDATE postlane_deliveries SET state = 'pending', "
                        f"lease_owner = NULL, lease_expires_at = NULL, "
                        f"attempt_started_at = NULL, updated_at = {NOW} WHERE id = ?",
                        (id_,),
                    )
                    requeued.append(id_)
                conn.execute(_INSERT_EVENT, (
                    id_, "lease_expired", "ambiguous" if started else "pending",
                    json.dumps(detail),
                ))
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
