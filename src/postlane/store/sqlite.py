"""The SQLite engine: the embedded default that needs nothing installed.

WAL mode with ``synchronous=FULL``; every write is one ``BEGIN IMMEDIATE`` transaction, so
claims from several processes serialise on SQLite's write lock. Times are REAL unix
seconds computed by SQLite itself (the database clock). Calls run on one thread per store.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from postlane.core.message import Delivery, EnqueueResult, Message
from postlane.core.states import State
from postlane.core.validation import Limits, validate
from postlane.errors import StoreError, TemplateDeprecated, UnknownTemplate
from postlane.store import migrations
from postlane.store.base import (
    DEAD_LETTER_COLUMNS,
    DELIVERY_COLUMNS,
    IMPORT_COLUMNS,
    STATUS_RANK,
    TEMPLATE_REFERENCE_CONDITION,
    ApiKey,
    Claim,
    Control,
    DeadLetter,
    DeadLetterFilter,
    Event,
    ImportCounts,
    ImportProgress,
    ImportRecord,
    LaneStats,
    ProviderEvent,
    ProviderEventResult,
    RescueResult,
    Stats,
    Store,
    Suppression,
    TemplateDeletion,
    TemplateVersion,
    Transition,
    bound_response,
    check_template_id,
    enqueue_results,
    find_conditions,
    import_counts_from_rows,
    suppression_for,
)

T = TypeVar("T")

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
_COLS = ", ".join(DELIVERY_COLUMNS)
_TIME_COLUMNS = frozenset({
    "run_at", "expires_at", "lease_expires_at", "attempt_started_at", "created_at",
    "updated_at", "sent_at", "finished_at",
})
_TERMINAL = "('sent', 'dead', 'expired', 'cancelled', 'suppressed')"

INSERT_ONE = f"""
INSERT INTO postlane_deliveries (
    idempotency_key, lane, channel, recipient, sender, subject, text_body, html_body, headers,
    metadata, import_id, template_id, template_version, run_at, expires_at, created_at,
    updated_at)
VALUES (:key, :lane, :channel, :recipient, :sender, :subject, :text, :html, :headers,
        :metadata, :import_id, :template_id, :template_version, {NOW} + :delay_s,
        COALESCE(:expires_at, {NOW} + :expires_in_s), {NOW}, {NOW})
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id
"""
_INSERT_EVENT = (
    f"INSERT INTO postlane_events (delivery_id, at, kind, state, data) "
    f"VALUES (?, {NOW}, ?, ?, ?)"
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


def message_params(message: Message) -> dict[str, Any]:
    return {
        "key": message.key,
        "lane": message.lane,
        "channel": message.channel,
        "recipient": message.to,
        "sender": message.sender,
        "subject": message.subject,
        "text": message.text,
        "html": message.html,
        "headers": json.dumps(dict(message.headers)),
        "metadata": json.dumps(dict(message.metadata)),
        "import_id": message.import_id,
        "template_id": message.template_id,
        "template_version": message.template_version,
        "delay_s": message.delay.total_seconds() if message.delay else 0.0,
        "expires_at": message.expires_at.timestamp() if message.expires_at else None,
        "expires_in_s": message.expires_in.total_seconds() if message.expires_in else None,
    }


def insert_one(conn: sqlite3.Connection, message: Message) -> EnqueueResult:
    """Insert-or-find in whatever transaction ``conn`` is in (shared with the outbox)."""
    row = conn.execute(INSERT_ONE, message_params(message)).fetchone()
    if row is not None:
        conn.execute(_INSERT_EVENT, (row[0], "enqueued", "pending", "{}"))
        return EnqueueResult(row[0], message.key, created=True)
    row = conn.execute(
        "SELECT id FROM postlane_deliveries WHERE idempotency_key = ?", (message.key,)
    ).fetchone()
    if row is None:  # pragma: no cover - SQLite serialises writers, so the winner is visible
        raise StoreError(f"key {message.key!r} conflicts but no row is visible")
    return EnqueueResult(row[0], message.key, created=False)


# One statement for a whole batch: the rows travel as one JSON array (json.dumps is cheap,
# a statement per row is not). Row fields by position, as _batch_row writes them.
_INSERT_MANY = f"""
INSERT INTO postlane_deliveries (
    idempotency_key, lane, channel, recipient, sender, subject, text_body, html_body, headers,
    metadata, import_id, template_id, template_version, run_at, expires_at, created_at,
    updated_at)
SELECT {", ".join(f"json_extract(value, '$[{i}]')" for i in range(13))},
       {NOW} + json_extract(value, '$[13]'),
       COALESCE(json_extract(value, '$[14]'), {NOW} + json_extract(value, '$[15]')),
       {NOW}, {NOW}
FROM json_each(:batch) WHERE true  -- (WHERE: SQLite's parser needs it before ON CONFLICT)
ORDER BY key  -- ids in input order
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key
"""
_IDS_BY_KEYS = (
    "SELECT id, idempotency_key FROM postlane_deliveries "
    "WHERE idempotency_key IN (SELECT value FROM json_each(?))"
)


def _json_map(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value)) if value else "{}"


def _batch_row(m: Message) -> tuple[Any, ...]:
    return (
        m.key, m.lane, m.channel, m.to, m.sender, m.subject, m.text, m.html,
        _json_map(m.headers), _json_map(m.metadata), m.import_id, m.template_id,
        m.template_version, m.delay.total_seconds() if m.delay else 0.0,
        m.expires_at.timestamp() if m.expires_at else None,
        m.expires_in.total_seconds() if m.expires_in else None,
    )


def insert_many(conn: sqlite3.Connection, messages: Sequence[Message]) -> list[EnqueueResult]:
    """Insert-or-find a batch in whatever transaction ``conn`` is in: one INSERT for the
    rows, one for their events, one look-up for the keys that existed already."""
    if not messages:
        return []
    created = dict((key, id_) for id_, key in conn.execute(
        _INSERT_MANY, {"batch": json.dumps([_batch_row(m) for m in messages])}))
    conn.executemany(_INSERT_EVENT, [(id_, "enqueued", "pending", "{}")
                                     for id_ in created.values()])
    existing: dict[str, int] = {}
    missing = list({m.key for m in messages if m.key not in created})
    if missing:
        existing = {key: id_ for id_, key in conn.execute(_IDS_BY_KEYS, (json.dumps(missing),))}
    return enqueue_results(messages, created, existing)


def connect(path: str) -> sqlite3.Connection:
    """A connection configured as every Postlane SQLite connection must be."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


class SQLiteStore(Store):
    engine = "sqlite"

    def __init__(self, path: str, *, limits: Limits | None = None) -> None:
        super().__init__(limits)
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="postlane-sqlite")
        self._wakeup = asyncio.Event()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def open(self) -> None:
        def _open() -> None:
            try:
                self._conn = connect(self.path)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        await self._run(_open)

    async def close(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        await self._run(_close)
        self._thread.shutdown(wait=True)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("store is not open; use `async with store:` or `await store.open()`")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # -- migrations ------------------------------------------------------------------------
    def _applied(self) -> set[int]:
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {migrations.MIGRATIONS_TABLE} ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        rows = self.conn.execute(f"SELECT version FROM {migrations.MIGRATIONS_TABLE}")
        return {r[0] for r in rows}

    async def migrate(self) -> list[str]:
        def _migrate() -> list[str]:
            applied = []
            with self._write():
                done = self._applied()
            for migration in migrations.load(self.engine):
                if migration.version in done:
                    continue
                # executescript commits first, so the migration brings its own transaction.
                # It records itself first: a concurrent migrator that applied it since we
                # read ``done`` makes that INSERT fail, and we roll back and move on.
                try:
                    self.conn.executescript(
                        "BEGIN IMMEDIATE;\n"
                        f"INSERT INTO {migrations.MIGRATIONS_TABLE} (version, name, applied_at) "
                        f"VALUES ({migration.version}, '{migration.name}', {NOW});\n"
                        f"{migration.sql}\n"
                        "COMMIT;"
                    )
                except sqlite3.Error:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    if migration.version in self._applied():
                        continue
                    raise
                applied.append(migration.label)
            return applied
        return await self._run(_migrate)

    async def pending_migrations(self) -> list[str]:
        def _pending() -> list[str]:
            exists = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                (migrations.MIGRATIONS_TABLE,),
            ).fetchone()
            done = self._applied() if exists else set()
            return [m.label for m in migrations.load(self.engine) if m.version not in done]
        return await self._run(_pending)

    # -- producing -------------------------------------------------------------------------
    async def enqueue(self, message: Message) -> EnqueueResult:
        validate(message, self.limits)

        def _enqueue() -> EnqueueResult:
            with self._write() as conn:
                return insert_one(conn, message)
        result = await self._run(_enqueue)
        self._wakeup.set()
        return result

    async def enqueue_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        for message in messages:
            validate(message, self.limits)

        def _enqueue_many() -> list[EnqueueResult]:
            with self._write() as conn:
                return insert_many(conn, messages)
        results = await self._run(_enqueue_many)
        self._wakeup.set()
        return results

    # -- the worker's path -----------------------------------------------------------------
    async def claim_batch(
        self, lane: str, limit: int, owner: str, lease: timedelta,
        exclude_imports: Sequence[str] = (),
    ) -> list[Delivery]:
        excluded = json.dumps(list(exclude_imports))

        def _claim() -> list[Delivery]:
            with self._write() as conn:
                rows = conn.execute(
                    f"""
                    UPDATE postlane_deliveries
                    SET state = 'sending', lease_owner = :owner,
                        lease_expires_at = {NOW} + :lease_s, claims = claims + 1,
                        attempt_started_at = NULL, updated_at = {NOW}
                    WHERE id IN (
                        SELECT id FROM postlane_deliveries
                        WHERE state = 'pending' AND lane = :lane AND run_at <= {NOW}
                          AND (import_id IS NULL OR import_id NOT IN
                               (SELECT value FROM json_each(:excluded)))
                        ORDER BY run_at, id LIMIT :limit)
                    RETURNING {_COLS}
                    """,
                    {"owner": owner, "lease_s": lease.total_seconds(), "lane": lane,
                     "limit": limit, "excluded": excluded},
                ).fetchall()
                conn.executemany(_INSERT_EVENT, [
                    (r[0], "claimed", "sending",
                     json.dumps({"owner": owner, "claim": r[DELIVERY_COLUMNS.index("claims")]}))
                    for r in rows
                ])
            deliveries = [_delivery(r) for r in rows]
            deliveries.sort(key=lambda d: (d.run_at, d.id))
            return deliveries
        return await self._run(_claim)

    def _guarded_ids(self, sql: str, owner: str, claims: Sequence[Claim],
                     extra: dict[str, Any]) -> set[int]:
        with self._write() as conn:
            rows = conn.execute(sql, {
                "claims": json.dumps([[c.id, c.claims] for c in claims]), "owner": owner,
                **extra}).fetchall()
        return {row[0] for row in rows}

    async def start_attempts(self, owner: str, claims: Sequence[Claim]) -> set[int]:
        if not claims:
            return set()
        return await self._run(self._guarded_ids, _START, owner, claims, {})

    async def renew_leases(
        self, owner: str, claims: Sequence[Claim], lease: timedelta
    ) -> set[int]:
        if not claims:
            return set()
        return await self._run(
            self._guarded_ids, _RENEW, owner, claims, {"lease_s": lease.total_seconds()}
        )

    async def set_state_if_sending_many(
        self, owner: str, transitions: Sequence[Transition]
    ) -> set[int]:
        if not transitions:
            return set()
        return await self._run(self._set_state_many, owner, transitions)

    async def set_state_if_ambiguous_many(self, transitions: Sequence[Transition]) -> set[int]:
        if not transitions:
            return set()
        return await self._run(self._set_state_many, None, transitions)

    async def list_ambiguous(
        self, limit: int = 100, lanes: Sequence[str] | None = None
    ) -> list[Delivery]:
        def _list() -> list[Delivery]:
            rows = self.conn.execute(
                f"SELECT {_COLS} FROM postlane_deliveries WHERE state = 'ambiguous' "
                "AND (:lanes IS NULL OR lane IN (SELECT value FROM json_each(:lanes))) "
                "ORDER BY updated_at, id LIMIT :limit",
                {"lanes": None if lanes is None else json.dumps(list(lanes)), "limit": limit},
            ).fetchall()
            return [_delivery(r) for r in rows]
        return await self._run(_list)

    def _set_state_many(
        self, owner: str | None, transitions: Sequence[Transition]
    ) -> set[int]:
        """Guarded by (sending, owner) when ``owner`` is given, else by ``ambiguous``."""
        sql = _SET_STATE_IF_SENDING if owner is not None else _SET_STATE_IF_AMBIGUOUS
        batch = json.dumps([
            [t.id, t.claims, str(t.state), t.delay_s, 1 if t.spend_attempt else 0,
             bound_response(t.error), t.provider_message_id, t.dead_reason]
            for t in transitions
        ])
        with self._write() as conn:
            applied = {row[0] for row in conn.execute(sql, {"batch": batch, "owner": owner})}
            done = [t for t in transitions if t.id in applied]
            conn.executemany(_INSERT_EVENT, [
                (t.id, t.event, str(t.state), json.dumps(t.detail)) for t in done])
            # After the events: the dead letter's attempt history includes this attempt.
            for t in done:
                if t.state in (State.DEAD, State.EXPIRED):
                    row = conn.execute(
                        f"SELECT {_COLS} FROM postlane_deliveries WHERE id = ?", (t.id,)
                    ).fetchone()
                    self._write_dead_letter(conn, row, t.dead_reason or str(t.state))
        return applied

    def _write_dead_letter(self, conn: sqlite3.Connection, row: Sequence[Any],
                           reason: str) -> None:
        values = dict(zip(DELIVERY_COLUMNS, row, strict=True))
        snapshot = {
            k: (_iso(v) if k in _TIME_COLUMNS else v) for k, v in values.items()
        }
        snapshot["headers"] = json.loads(values["headers"])
        snapshot["metadata"] = json.loads(values["metadata"])
        history = [
            {**json.loads(data), "at": _iso(at)}
            for data, at in conn.execute(
                "SELECT data, at FROM postlane_events WHERE delivery_id = ? "
                "AND json_extract(data, '$.outcome') IS NOT NULL ORDER BY id", (values["id"],))
        ]
        conn.execute(
            f"""
            INSERT INTO postlane_dead_letters
                (delivery_id, reason, snapshot, last_response, attempt_history, dead_at)
            VALUES (?, ?, ?, ?, ?, {NOW})
            ON CONFLICT (delivery_id) DO UPDATE SET
                reason = excluded.reason, snapshot = excluded.snapshot,
                last_response = excluded.last_response,
                attempt_history = excluded.attempt_history, dead_at = excluded.dead_at,
                discarded_at = NULL, discard_reason = NULL
            """,
            (values["id"], reason, json.dumps(snapshot), values["last_error"],
             json.dumps(history)),
        )

    async def rescue_expired_leases(self, limit: int = 1000) -> RescueResult:
        def _rescue() -> RescueResult:
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
        return await self._run(_rescue)

    async def wait_for_work(self, timeout: float) -> None:
        """Wake on an in-process enqueue, or on a commit by another connection
        (``PRAGMA data_version``), polled every 50 ms."""
        def _version() -> int:
            return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

        deadline = time.monotonic() + timeout
        start = await self._run(_version)
        while not self._wakeup.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(min(0.05, left)):
                    await self._wakeup.wait()
            except TimeoutError:
                if await self._run(_version) != start:
                    break
        self._wakeup.clear()

    # -- controls shared by the fleet ------------------------------------------------------
    async def get_controls(self) -> dict[str, Control]:
        def _get() -> dict[str, Control]:
            rows = self.conn.execute(
                "SELECT name, value, version, updated_at FROM postlane_controls"
            ).fetchall()
            return {r[0]: Control(r[0], json.loads(r[1]), r[2], _dt(r[3])) for r in rows}
        return await self._run(_get)

    async def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        def _set() -> None:
            with self._write() as conn:
                if value is None:
                    conn.execute("DELETE FROM postlane_controls WHERE name = ?", (name,))
                    return
                conn.execute(
                    f"INSERT INTO postlane_controls (name, value, updated_at) "
                    f"VALUES (?, ?, {NOW}) ON CONFLICT (name) DO UPDATE SET "
                    f"value = excluded.value, version = version + 1, updated_at = {NOW}",
                    (name, json.dumps(dict(value))),
                )
        await self._run(_set)

    async def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        def _cas() -> bool:
            with self._write() as conn:
                if expected_version is None:
                    row = conn.execute(
                        f"INSERT INTO postlane_controls (name, value, updated_at) "
                        f"VALUES (?, ?, {NOW}) ON CONFLICT (name) DO NOTHING RETURNING name",
                        (name, json.dumps(dict(value))),
                    ).fetchone()
                else:
                    row = conn.execute(
                        f"UPDATE postlane_controls SET value = ?, version = version + 1, "
                        f"updated_at = {NOW} WHERE name = ? AND version = ? RETURNING name",
                        (json.dumps(dict(value)), name, expected_version),
                    ).fetchone()
                return row is not None
        return await self._run(_cas)

    # -- reading and operating -------------------------------------------------------------
    async def get(self, id_or_key: int | str) -> Delivery | None:
        column = "id" if isinstance(id_or_key, int) else "idempotency_key"

        def _get() -> Delivery | None:
            row = self.conn.execute(
                f"SELECT {_COLS} FROM postlane_deliveries WHERE {column} = ?", (id_or_key,)
            ).fetchone()
            return _delivery(row) if row else None
        return await self._run(_get)

    async def timeline(self, delivery_id: int) -> list[Event]:
        def _timeline() -> list[Event]:
            rows = self.conn.execute(
                "SELECT id, delivery_id, at, kind, state, data FROM postlane_events "
                "WHERE delivery_id = ? ORDER BY id", (delivery_id,)
            ).fetchall()
            return [Event(r[0], r[1], _dt(r[2]), r[3], r[4], json.loads(r[5])) for r in rows]
        return await self._run(_timeline)

    async def dead_letter(self, delivery_id: int) -> DeadLetter | None:
        found = await self._run(self._dead_letters, "dl.delivery_id = :id",
                                {"id": delivery_id}, 1)
        return found[0] if found else None

    async def list_dead_letters(
        self, selection: DeadLetterFilter = DeadLetterFilter(), limit: int = 100
    ) -> list[DeadLetter]:
        where, params = selection.where(lambda name: f":{name}", lambda when: when.timestamp())
        return await self._run(self._dead_letters, where, params, limit)

    def _dead_letters(self, where: str, params: dict[str, Any],
                      limit: int) -> list[DeadLetter]:
        rows = self.conn.execute(
            f"SELECT {DEAD_LETTER_COLUMNS} FROM postlane_dead_letters dl "
            f"JOIN postlane_deliveries d ON d.id = dl.delivery_id WHERE {where} "
            f"ORDER BY dl.dead_at, dl.delivery_id LIMIT :limit", {**params, "limit": limit},
        ).fetchall()
        return [
            DeadLetter(r[0], r[1], json.loads(r[2]), r[3], json.loads(r[4]), _dt(r[5]),
                       _opt_dt(r[6]), r[7], _opt_dt(r[8]), r[9], r[10], r[11])
            for r in rows
        ]

    async def replay_dead_letters(self, ids: Sequence[int], by: str) -> set[int]:
        def _replay() -> set[int]:
            replayed = set()
            with self._write() as conn:
                for delivery_id in ids:
                    row = conn.execute(
                        f"""UPDATE postlane_dead_letters
                        SET replayed_at = {NOW}, replayed_by = ?, replay_count = replay_count + 1
                        WHERE delivery_id = ? AND discarded_at IS NULL AND EXISTS (
                            SELECT 1 FROM postlane_deliveries d WHERE d.id = delivery_id
                              AND d.state IN ('dead', 'expired'))
                        RETURNING replay_count""", (by, delivery_id),
                    ).fetchone()
                    if row is None:
                        continue
                    conn.execute(
                        f"UPDATE postlane_deliveries SET state = 'pending', attempts = 0, "
                        f"run_at = {NOW}, dead_reason = NULL, finished_at = NULL, "
                        f"updated_at = {NOW} WHERE id = ?", (delivery_id,),
                    )
                    conn.execute(_INSERT_EVENT, (delivery_id, "replayed", "pending",
                                                 json.dumps({"by": by, "replay": row[0]})))
                    replayed.add(delivery_id)
            return replayed
        if not ids:
            return set()
        result = await self._run(_replay)
        self._wakeup.set()
        return result

    async def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        def _discard() -> bool:
            with self._write() as conn:
                row = conn.execute(
                    f"""UPDATE postlane_dead_letters SET discarded_at = {NOW}, discard_reason = ?
                    WHERE delivery_id = ? AND discarded_at IS NULL AND EXISTS (
                        SELECT 1 FROM postlane_deliveries d WHERE d.id = delivery_id
                          AND d.state IN ('dead', 'expired'))
                    RETURNING delivery_id""", (reason, delivery_id),
                ).fetchone()
                if row is not None:
                    conn.execute(_INSERT_EVENT, (delivery_id, "discarded", None,
                                                 json.dumps({"by": by, "reason": reason})))
                return row is not None
        return await self._run(_discard)

    async def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        conditions, params = find_conditions(key, recipient, import_id, ":{}")

        def _find() -> list[Delivery]:
            rows = self.conn.execute(
                f"SELECT {_COLS} FROM postlane_deliveries WHERE {conditions} "
                f"ORDER BY id DESC LIMIT :limit", {**params, "limit": limit},
            ).fetchall()
            return [_delivery(r) for r in rows]
        return await self._run(_find)

    async def stats(self) -> Stats:
        def _stats() -> Stats:
            conn = self.conn
            lanes = {name: LaneStats(0, 0.0) for name in self.limits.lanes}
            for lane, depth, age in conn.execute(
                f"SELECT lane, count(*), {NOW} - min(created_at) FROM postlane_deliveries "
                f"WHERE state IN ('pending', 'sending') GROUP BY lane"
            ):
                lanes[lane] = LaneStats(int(depth), max(0.0, float(age or 0)))
            states = {str(s): 0 for s in State}
            states.update(dict(conn.execute(
                "SELECT state, count(*) FROM postlane_deliveries GROUP BY state"
            ).fetchall()))
            attempts = {str(a): int(n) for a, n in conn.execute(
                "SELECT attempts + 1, count(*) FROM postlane_deliveries "
                "WHERE state IN ('pending', 'sending') GROUP BY 1 ORDER BY 1"
            )}
            dead = dict(conn.execute(
                "SELECT dl.reason, count(*) FROM postlane_dead_letters dl "
                "JOIN postlane_deliveries d ON d.id = dl.delivery_id "
                "WHERE dl.discarded_at IS NULL AND d.state IN ('dead', 'expired') "
                "GROUP BY dl.reason"
            ).fetchall())
            return Stats(lanes=lanes, states=states, attempts=attempts, dead_letters=dead)
        return await self._run(_stats)

    async def cancel(self, delivery_id: int, reason: str = "") -> bool:
        def _cancel() -> bool:
            with self._write() as conn:
                row = conn.execute(
                    f"UPDATE postlane_deliveries SET state = 'cancelled', finished_at = {NOW}, "
                    f"updated_at = {NOW} WHERE id = ? AND state IN ('pending', 'ambiguous') "
                    f"RETURNING id", (delivery_id,)
                ).fetchone()
                if row:
                    conn.execute(_INSERT_EVENT, (delivery_id, "cancelled", "cancelled",
                                                 json.dumps({"reason": reason})))
                return row is not None
        return await self._run(_cancel)

    async def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        def _prune() -> int:
            total = 0
            while True:
                with self._write() as conn:
                    ids = [r[0] for r in conn.execute(
                        f"""SELECT id FROM postlane_deliveries
                            WHERE finished_at IS NOT NULL AND (
                                (state IN ('sent', 'expired', 'cancelled', 'suppressed')
                                    AND finished_at < {NOW} - ?)
                                OR (state = 'dead' AND finished_at < {NOW} - ?))
                            LIMIT 5000""",
                        (finished_before.total_seconds(), dead_before.total_seconds()),
                    )]
                    batch = json.dumps(ids)
                    # The timeline has no foreign key (checked on every event insert);
                    # a delivery and its events go together here.
                    conn.execute("DELETE FROM postlane_events WHERE delivery_id IN "
                                 "(SELECT value FROM json_each(?))", (batch,))
                    conn.execute("DELETE FROM postlane_deliveries WHERE id IN "
                                 "(SELECT value FROM json_each(?))", (batch,))
                total += len(ids)
                if len(ids) < 5000:
                    return total
        return await self._run(_prune)

    # -- provider events and the suppression list -------------------------------------------
    async def record_provider_event(self, event: ProviderEvent) -> ProviderEventResult:
        def _record() -> ProviderEventResult:
            with self._write() as conn:
                found = conn.execute(
                    "SELECT id, lane, recipient FROM postlane_deliveries "
                    "WHERE provider_message_id = ? ORDER BY id DESC LIMIT 1",
                    (event.provider_message_id,),
                ).fetchone()
                delivery_id = found[0] if found else None
                inserted = conn.execute(
                    f"INSERT INTO postlane_provider_events (provider, event_id, kind, "
                    f"provider_message_id, delivery_id, received_at) "
                    f"VALUES (?, ?, ?, ?, ?, {NOW}) ON CONFLICT DO NOTHING RETURNING event_id",
                    (event.provider, event.event_id, event.kind, event.provider_message_id,
                     delivery_id),
                ).fetchone()
                if inserted is None:
                    return ProviderEventResult(True, delivery_id, False)
                if found is None:
                    return ProviderEventResult(False, None, False)
                _, lane, recipient = found
                conn.execute(_INSERT_EVENT, (
                    delivery_id, f"provider:{event.kind}", None,
                    json.dumps({"provider": event.provider, "event_id": event.event_id,
                                **dict(event.data)}),
                ))
                current = conn.execute(
                    "SELECT provider_status FROM postlane_deliveries WHERE id = ?",
                    (delivery_id,),
                ).fetchone()[0]
                changed = STATUS_RANK.get(event.kind, -1) > STATUS_RANK.get(current or "", -1)
                if changed:
                    conn.execute("UPDATE postlane_deliveries SET provider_status = ? "
                                 "WHERE id = ?", (event.kind, delivery_id))
                suppressed = None
                rule = suppression_for(event, lane)
                if rule is not None:
                    suppressed = (event.recipient or recipient).lower()
                    conn.execute(
                        f"INSERT INTO postlane_suppressions (address, stream, reason, "
                        f"delivery_id, created_at) VALUES (?, ?, ?, ?, {NOW}) "
                        f"ON CONFLICT DO NOTHING",
                        (suppressed, rule[0], rule[1], delivery_id),
                    )
                return ProviderEventResult(False, delivery_id, changed, suppressed)
        return await self._run(_record)

    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None) -> bool:
        def _suppress() -> bool:
            with self._write() as conn:
                row = conn.execute(
                    f"INSERT INTO postlane_suppressions (address, stream, reason, delivery_id, "
                    f"created_at) VALUES (?, ?, ?, ?, {NOW}) ON CONFLICT DO NOTHING "
                    f"RETURNING address", (address.lower(), stream, reason, delivery_id),
                ).fetchone()
                return row is not None
        return await self._run(_suppress)

    async def unsuppress(self, address: str, stream: str | None = None) -> int:
        def _unsuppress() -> int:
            with self._write() as conn:
                cur = conn.execute(
                    "DELETE FROM postlane_suppressions WHERE address = ? "
                    "AND (? IS NULL OR stream = ?)", (address.lower(), stream, stream),
                )
                return cur.rowcount
        return await self._run(_unsuppress)

    async def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]:
        def _list() -> list[Suppression]:
            key = address.lower() if address else None
            rows = self.conn.execute(
                "SELECT address, stream, reason, delivery_id, created_at "
                "FROM postlane_suppressions WHERE (? IS NULL OR address = ?) "
                "ORDER BY created_at DESC LIMIT ?", (key, key, limit),
            ).fetchall()
            return [Suppression(r[0], r[1], r[2], r[3], _dt(r[4])) for r in rows]
        return await self._run(_list)

    async def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        if not deliveries:
            return {}
        batch = json.dumps([{"id": d.id, "address": d.recipient.lower(), "lane": d.lane}
                            for d in deliveries])

        def _among() -> dict[int, str]:
            rows = self.conn.execute(
                "SELECT json_extract(t.value, '$.id'), s.reason FROM json_each(?) t "
                "JOIN postlane_suppressions s "
                "ON s.address = json_extract(t.value, '$.address') "
                "AND s.stream IN (json_extract(t.value, '$.lane'), '*')", (batch,),
            ).fetchall()
            return {int(r[0]): r[1] for r in rows}
        return await self._run(_among)

    async def requeue_suppressed(self, address: str) -> list[int]:
        def _requeue() -> list[int]:
            with self._write() as conn:
                ids = [r[0] for r in conn.execute(
                    f"UPDATE postlane_deliveries SET state = 'pending', run_at = {NOW}, "
                    f"finished_at = NULL, updated_at = {NOW} "
                    f"WHERE lower(recipient) = ? AND state = 'suppressed' RETURNING id",
                    (address.lower(),),
                ).fetchall()]
                conn.executemany(_INSERT_EVENT, [(i, "unsuppressed", "pending", "{}")
                                                 for i in ids])
                return sorted(ids)
        ids = await self._run(_requeue)
        self._wakeup.set()
        return ids

    # -- templates and bulk imports ----------------------------------------------------------
    _TEMPLATE_COLS = (
        "v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at, "
        "t.latest_version, t.deprecated_at IS NOT NULL"
    )
    _GET_TEMPLATE = f"""
    SELECT {_TEMPLATE_COLS} FROM postlane_templates t
    JOIN postlane_template_versions v ON v.name = t.name
    WHERE t.name = :name AND t.deleted_at IS NULL
      AND v.version = COALESCE(:version, t.latest_version)
    """
    _COUNT_TEMPLATE_REFERENCES = (
        "SELECT count(*) FROM postlane_deliveries d "
        f"WHERE d.template_id = ? AND {TEMPLATE_REFERENCE_CONDITION}"
    )
    _IMPORT_PROGRESS = f"""
    UPDATE postlane_imports SET rows_read = :read, rows_enqueued = :enqueued,
        rows_skipped = :skipped, rows_created = rows_created + :created,
        finished_at = CASE WHEN :finished THEN {NOW} ELSE NULL END, updated_at = {NOW}
    WHERE import_id = :id
    """

    @staticmethod
    def _template(row: Sequence[Any]) -> TemplateVersion:
        return TemplateVersion(row[0], row[1], row[2], row[3], row[4], _dt(row[5]), row[6],
                               bool(row[7]))

    @classmethod
    def template_on_connection(
        cls, conn: sqlite3.Connection, name: str, version: int | None = None
    ) -> TemplateVersion | None:
        """Read a template version through ``conn``, in whatever transaction it is in."""
        row = conn.execute(cls._GET_TEMPLATE, {"name": name, "version": version}).fetchone()
        return cls._template(row) if row else None

    async def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        def _add() -> TemplateVersion:
            with self._write() as conn:
                conn.execute(
                    f"INSERT INTO postlane_templates (name, latest_version, created_at, "
                    f"updated_at) VALUES (?, 1, {NOW}, {NOW}) ON CONFLICT (name) DO UPDATE SET "
                    f"latest_version = latest_version + 1, deleted_at = NULL, "
                    f"updated_at = {NOW}", (name,))
                conn.execute(
                    f"INSERT INTO postlane_template_versions "
                    f"(name, version, subject, text_body, html_body, created_at) "
                    f"SELECT name, latest_version, ?, ?, ?, {NOW} FROM postlane_templates "
                    f"WHERE name = ?", (subject, text, html, name))
                found = self.template_on_connection(conn, name)
            assert found is not None
            return found
        return await self._run(_add)

    async def get_template(self, name: str, version: int | None = None) -> TemplateVersion | None:
        return await self._run(self.template_on_connection, self.conn, name, version)

    async def list_templates(self) -> list[TemplateVersion]:
        def _list() -> list[TemplateVersion]:
            rows = self.conn.execute(
                f"SELECT {self._TEMPLATE_COLS} FROM postlane_templates t "
                "JOIN postlane_template_versions v "
                "ON v.name = t.name AND v.version = t.latest_version "
                "WHERE t.deleted_at IS NULL ORDER BY t.name").fetchall()
            return [self._template(r) for r in rows]
        return await self._run(_list)

    async def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        def _set() -> bool:
            with self._write() as conn:
                row = conn.execute(
                    f"UPDATE postlane_templates SET deprecated_at = CASE WHEN :on "
                    f"THEN COALESCE(deprecated_at, {NOW}) END, updated_at = {NOW} "
                    f"WHERE name = :name AND deleted_at IS NULL RETURNING name",
                    {"on": deprecated, "name": name}).fetchone()
                return row is not None
        return await self._run(_set)

    async def count_template_references(self, name: str) -> int:
        def _count() -> int:
            return int(self.conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,)).fetchone()[0])
        return await self._run(_count)

    async def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        def _delete() -> TemplateDeletion:
            with self._write() as conn:
                if conn.execute("SELECT 1 FROM postlane_templates WHERE name = ? "
                                "AND deleted_at IS NULL", (name,)).fetchone() is None:
                    return TemplateDeletion(found=False, deleted=False, references=0)
                references = int(
                    conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,)).fetchone()[0])
                if references:
                    return TemplateDeletion(found=True, deleted=False, references=references)
                conn.execute("DELETE FROM postlane_template_versions WHERE name = ?", (name,))
                conn.execute(
                    f"UPDATE postlane_templates SET deleted_at = {NOW}, deprecated_at = NULL, "
                    f"updated_at = {NOW} WHERE name = ?", (name,))
            return TemplateDeletion(found=True, deleted=True, references=0)
        return await self._run(_delete)

    async def enqueue_many_if_template_usable(
        self, template: str, messages: Sequence[Message],
        progress: ImportProgress | None = None, *, validated: bool = False,
    ) -> list[EnqueueResult]:
        for message in messages:
            if not validated:
                validate(message, self.limits)
            check_template_id(message, template)

        def _enqueue() -> list[EnqueueResult]:
            with self._write() as conn:
                row = conn.execute(
                    "SELECT deprecated_at IS NOT NULL FROM postlane_templates "
                    "WHERE name = ? AND deleted_at IS NULL", (template,)).fetchone()
                if row is None:
                    raise UnknownTemplate(f"unknown template {template!r}", field="template_id")
                if row[0]:
                    raise TemplateDeprecated(
                        f"template {template!r} is deprecated: it takes no new enqueues",
                        field="template_id")
                results = insert_many(conn, messages)
                if progress is not None:
                    conn.execute(self._IMPORT_PROGRESS, {
                        "id": progress.import_id, "read": progress.rows_read,
                        "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                        "created": sum(1 for r in results if r.created), "finished": False})
                return results
        results = await self._run(_enqueue)
        if messages:
            self._wakeup.set()
        return results

    async def start_import(
        self, import_id: str, template: str, template_version: int, file_name: str, lane: str
    ) -> ImportRecord | None:
        def _start() -> ImportRecord | None:
            with self._write() as conn:
                row = conn.execute(
                    f"INSERT INTO postlane_imports (import_id, template, template_version, "
                    f"file_name, lane, started_at, last_started_at, updated_at) "
                    f"VALUES (?, ?, ?, ?, ?, {NOW}, {NOW}, {NOW}) "
                    f"ON CONFLICT (import_id) DO UPDATE SET runs = runs + 1, "
                    f"last_started_at = {NOW}, finished_at = NULL, "
                    f"template_version = excluded.template_version, "
                    f"file_name = excluded.file_name, lane = excluded.lane, rows_read = 0, "
                    f"rows_enqueued = 0, rows_created = 0, rows_skipped = 0, "
                    f"updated_at = {NOW} WHERE template = excluded.template "
                    f"RETURNING {IMPORT_COLUMNS}",
                    (import_id, template, template_version, file_name, lane)).fetchone()
            return self._import(row) if row else None
        return await self._run(_start)

    @staticmethod
    def _import(row: Sequence[Any]) -> ImportRecord:
        v = list(row)
        v[6], v[7], v[8] = _dt(v[6]), _dt(v[7]), _opt_dt(v[8])
        return ImportRecord(*v)

    async def finish_import(self, progress: ImportProgress) -> None:
        def _finish() -> None:
            with self._write() as conn:
                conn.execute(self._IMPORT_PROGRESS, {
                    "id": progress.import_id, "read": progress.rows_read,
                    "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                    "created": 0, "finished": True})
        await self._run(_finish)

    async def get_import(self, import_id: str) -> ImportRecord | None:
        def _get() -> ImportRecord | None:
            row = self.conn.execute(
                f"SELECT {IMPORT_COLUMNS} FROM postlane_imports WHERE import_id = ?",
                (import_id,)).fetchone()
            return self._import(row) if row else None
        return await self._run(_get)

    async def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        def _list() -> list[ImportRecord]:
            rows = self.conn.execute(
                f"SELECT {IMPORT_COLUMNS} FROM postlane_imports "
                "ORDER BY last_started_at DESC, import_id LIMIT ?", (limit,)).fetchall()
            return [self._import(r) for r in rows]
        return await self._run(_list)

    async def import_counts(self, import_id: str) -> ImportCounts:
        def _counts() -> ImportCounts:
            rows = self.conn.execute(
                f"SELECT state, attempts > 0, count(*), {NOW} - min(created_at) "
                "FROM postlane_deliveries WHERE import_id = ? GROUP BY 1, 2",
                (import_id,)).fetchall()
            return import_counts_from_rows(rows)
        return await self._run(_counts)

    # -- the HTTP API: keys, and requests made idempotent by their body -------------------
    async def enqueue_request(
        self, message: Message, request_hash: str
    ) -> tuple[EnqueueResult, str | None]:
        validate(message, self.limits)

        def _enqueue() -> tuple[EnqueueResult, str | None]:
            with self._write() as conn:
                result = insert_one(conn, message)
                if result.created:
                    conn.execute("UPDATE postlane_deliveries SET request_hash = ? WHERE id = ?",
                                 (request_hash, result.id))
                    return result, request_hash
                row = conn.execute("SELECT request_hash FROM postlane_deliveries WHERE id = ?",
                                   (result.id,)).fetchone()
                return result, row[0]
        result = await self._run(_enqueue)
        self._wakeup.set()
        return result

    async def create_api_key(
        self, name: str, prefix: str, token_hash: str, scopes: Sequence[str]
    ) -> ApiKey:
        def _create() -> ApiKey:
            with self._write() as conn:
                row = conn.execute(
                    f"INSERT INTO postlane_api_keys (name, prefix, token_hash, scopes, "
                    f"created_at) VALUES (?, ?, ?, ?, {NOW}) RETURNING {_API_KEY_COLS}",
                    (name, prefix, token_hash, ",".join(scopes)),
                ).fetchone()
            return _api_key(row)
        return await self._run(_create)

    async def get_api_key(
        self, *, key_id: int | None = None, token_hash: str | None = None
    ) -> ApiKey | None:
        column, value = ("id", key_id) if key_id is not None else ("token_hash", token_hash)

        def _get() -> ApiKey | None:
            row = self.conn.execute(
                f"SELECT {_API_KEY_COLS} FROM postlane_api_keys WHERE {column} = ?", (value,)
            ).fetchone()
            return _api_key(row) if row else None
        return await self._run(_get)

    async def list_api_keys(self) -> list[ApiKey]:
        def _list() -> list[ApiKey]:
            rows = self.conn.execute(
                f"SELECT {_API_KEY_COLS} FROM postlane_api_keys ORDER BY id").fetchall()
            return [_api_key(r) for r in rows]
        return await self._run(_list)

    async def revoke_api_key(self, key_id: int) -> bool:
        def _revoke() -> bool:
            with self._write() as conn:
                row = conn.execute(
                    f"UPDATE postlane_api_keys SET revoked_at = {NOW} "
                    "WHERE id = ? AND revoked_at IS NULL RETURNING id", (key_id,)).fetchone()
            return row is not None
        return await self._run(_revoke)


def _dt(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _opt_dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _iso(value: float | None) -> str | None:
    return None if value is None else _dt(value).isoformat()


def _delivery(row: Sequence[Any]) -> Delivery:
    v = dict(zip(DELIVERY_COLUMNS, row, strict=True))
    return Delivery(
        id=v["id"], key=v["idempotency_key"], lane=v["lane"], channel=v["channel"],
        recipient=v["recipient"], sender=v["sender"], subject=v["subject"],
        text=v["text_body"], html=v["html_body"], headers=json.loads(v["headers"]),
        metadata=json.loads(v["metadata"]), import_id=v["import_id"],
        template_id=v["template_id"], template_version=v["template_version"],
        state=State(v["state"]), attempts=v["attempts"], claims=v["claims"],
        run_at=_dt(v["run_at"]), expires_at=_opt_dt(v["expires_at"]),
        lease_owner=v["lease_owner"], lease_expires_at=_opt_dt(v["lease_expires_at"]),
        attempt_started_at=_opt_dt(v["attempt_started_at"]),
        provider_message_id=v["provider_message_id"], dead_reason=v["dead_reason"],
        last_error=v["last_error"], created_at=_dt(v["created_at"]),
        updated_at=_dt(v["updated_at"]), sent_at=_opt_dt(v["sent_at"]),
        finished_at=_opt_dt(v["finished_at"]),
    )


_API_KEY_COLS = "id, name, prefix, scopes, created_at, revoked_at"


def _api_key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(s for s in row[3].split(",") if s),
                  _dt(row[4]), _opt_dt(row[5]))
