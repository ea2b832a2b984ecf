"""The PostgreSQL engine (psycopg 3, async, pooled): the production store for many hosts.

Claims use ``FOR UPDATE SKIP LOCKED``; every state write is one statement guarded by
state, lease owner and claim number; lease times come from the database clock (``now()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb, set_json_loads
from psycopg_pool import AsyncConnectionPool

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
    import_counts_from_rows,
    suppression_for,
)
from postlane.store.base import (
    find_conditions as _find_conditions,
)

CHANNEL = "postlane_enqueued"
_COLS = ", ".join(DELIVERY_COLUMNS)
_D_COLS = ", ".join(f"d.{c}" for c in DELIVERY_COLUMNS)
_TERMINAL = "('sent', 'dead', 'expired', 'cancelled', 'suppressed')"

# -- producing ---------------------------------------------------------------------------
_INSERT_COLS = (
    "idempotency_key, lane, channel, recipient, sender, subject, text_body, html_body, "
    "headers, metadata, import_id, template_id, template_version, run_at, expires_at"
)
INSERT_ONE = f"""
WITH ins AS (
    INSERT INTO postlane_deliveries ({_INSERT_COLS})
    VALUES (%(key)s, %(lane)s, %(channel)s, %(recipient)s, %(sender)s, %(subject)s, %(text)s,
            %(html)s, %(headers)s, %(metadata)s, %(import_id)s, %(template_id)s,
            %(template_version)s, now() + make_interval(secs => %(delay_s)s::float8),
            COALESCE(%(expires_at)s::timestamptz,
                     now() + make_interval(secs => %(expires_in_s)s::float8)))
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state)
    SELECT id, 'enqueued', 'pending' FROM ins
)
SELECT id FROM ins
"""
SELECT_ID_BY_KEY = "SELECT id FROM postlane_deliveries WHERE idempotency_key = %s"

_STAGING = """
CREATE TEMP TABLE postlane_staging (
    ord BIGINT, idempotency_key TEXT, lane TEXT, channel TEXT, recipient TEXT, sender TEXT,
    subject TEXT, text_body TEXT, html_body TEXT, headers TEXT, metadata TEXT, import_id TEXT,
    template_id TEXT, template_version INTEGER, delay_s FLOAT8, expires_at TIMESTAMPTZ,
    expires_in_s FLOAT8
) ON COMMIT DROP
"""
_COPY_STAGING = (
    "COPY postlane_staging (ord, idempotency_key, lane, channel, recipient, sender, subject, "
    "text_body, html_body, headers, metadata, import_id, template_id, template_version, "
    "delay_s, expires_at, expires_in_s) FROM STDIN"
)
_INSERT_STAGED = f"""
WITH ins AS (
    INSERT INTO postlane_deliveries ({_INSERT_COLS})
    SELECT idempotency_key, lane, channel, recipient, sender, subject, text_body, html_body,
           headers::jsonb, metadata::jsonb, import_id, template_id, template_version,
           now() + make_interval(secs => delay_s),
           COALESCE(expires_at, now() + make_interval(secs => expires_in_s))
    FROM postlane_staging ORDER BY ord
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, idempotency_key
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state)
    SELECT id, 'enqueued', 'pending' FROM ins
)
SELECT id, idempotency_key FROM ins
"""
_SELECT_IDS_BY_KEYS = (
    "SELECT id, idempotency_key FROM postlane_deliveries WHERE idempotency_key = ANY(%s)"
)
# The direct COPY's ids and clock, in one round trip. ``now()`` is the transaction's start,
# so run_at and expires_at computed from it equal what ``now()`` in an INSERT would give:
# the database clock, not the client's. (The sequence is named as a literal: resolved once
# at parse time, nextval costs a fifth of what it does through pg_get_serial_sequence.)
_RESERVE_IDS = """
SELECT now(), ARRAY(SELECT nextval('postlane_deliveries_id_seq') FROM generate_series(1, %s))
"""
# COPY writes given values into the identity column (as OVERRIDING SYSTEM VALUE would).
_COPY_DELIVERIES = f"COPY postlane_deliveries (id, {_INSERT_COLS}) FROM STDIN"
_ENQUEUED_EVENTS = (
    "INSERT INTO postlane_events (delivery_id, kind, state) "
    "SELECT unnest(%s::bigint[]), 'enqueued', 'pending'"
)


def message_params(message: Message) -> dict[str, Any]:
    """Bind parameters of ``INSERT_ONE`` for a validated message."""
    return {
        "key": message.key,
        "lane": message.lane,
        "channel": message.channel,
        "recipient": message.to,
        "sender": message.sender,
        "subject": message.subject,
        "text": message.text,
        "html": message.html,
        "headers": Jsonb(dict(message.headers)),
        "metadata": Jsonb(dict(message.metadata)),
        "import_id": message.import_id,
        "template_id": message.template_id,
        "template_version": message.template_version,
        "delay_s": message.delay.total_seconds() if message.delay else 0.0,
        "expires_at": message.expires_at,
        "expires_in_s": message.expires_in.total_seconds() if message.expires_in else None,
    }


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value)) if value else "{}"


def _staging_row(ord_: int, m: Message) -> tuple[Any, ...]:
    return (
        ord_, m.key, m.lane, m.channel, m.to, m.sender, m.subject, m.text, m.html,
        _json(m.headers), _json(m.metadata), m.import_id, m.template_id,
        m.template_version, m.delay.total_seconds() if m.delay else 0.0, m.expires_at,
        m.expires_in.total_seconds() if m.expires_in else None,
    )


# -- the worker's path -------------------------------------------------------------------
_CLAIM = f"""
WITH picked AS (
    SELECT id FROM postlane_deliveries
    WHERE state = 'pending' AND lane = %(lane)s AND run_at <= now()
      AND (import_id IS NULL OR NOT (import_id = ANY(%(exclude_imports)s::text[])))
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE postlane_deliveries d
    SET state = 'sending', lease_owner = %(owner)s,
        lease_expires_at = now() + make_interval(secs => %(lease_s)s::float8),
        claims = d.claims + 1, attempt_started_at = NULL, updated_at = now()
    FROM picked WHERE d.id = picked.id
    RETURNING {_D_COLS}
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'claimed', 'sending', jsonb_build_object('owner', %(owner)s::text, 'claim', claims)
    FROM claimed
)
SELECT {_COLS} FROM claimed ORDER BY run_at, id
"""
_START = """
-- No updated_at here: it is indexed (ambiguous rows), and leaving indexed columns alone
-- lets PostgreSQL update the row in place (HOT) on the hot path.
UPDATE postlane_deliveries d SET attempt_started_at = now()
FROM unnest(%(ids)s::bigint[], %(claims)s::int[]) AS t(id, claims)
WHERE d.id = t.id AND d.claims = t.claims  -- leased to me (see _LEASED_TO_ME):
  AND d.lease_owner = %(owner)s AND d.lease_expires_at > now()
RETURNING d.id
"""
_RENEW = """
UPDATE postlane_deliveries d
SET lease_expires_at = now() + make_interval(secs => %(lease_s)s::float8)
FROM unnest(%(ids)s::bigint[], %(claims)s::int[]) AS t(id, claims)
WHERE d.id = t.id AND d.claims = t.claims  -- leased to me (see _LEASED_TO_ME):
  AND d.lease_owner = %(owner)s AND d.lease_expires_at > now()
RETURNING d.id
"""
_SET_STATE_TEMPLATE = f"""
WITH t AS (
    -- One JSON document for the whole batch: json.dumps is far cheaper than ten arrays.
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb) AS t(
        id bigint, claims int, state text, delay_s float8, spend int, error text,
        pmid text, reason text, event text, detail jsonb)
), u AS (
    UPDATE postlane_deliveries d SET
        state = t.state,
        attempts = d.attempts + t.spend,
        run_at = CASE WHEN t.state = 'pending'
                      THEN now() + make_interval(secs => COALESCE(t.delay_s, 0))
                      ELSE d.run_at END,
        lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
        last_error = COALESCE(t.error, d.last_error),
        provider_message_id = COALESCE(t.pmid, d.provider_message_id),
        dead_reason = CASE WHEN t.state = 'dead' THEN t.reason ELSE d.dead_reason END,
        sent_at = CASE WHEN t.state = 'sent' THEN now() ELSE d.sent_at END,
        finished_at = CASE WHEN t.state IN {_TERMINAL} THEN now() ELSE NULL END,
        updated_at = now()
    FROM t
    WHERE d.id = t.id AND d.claims = t.claims AND __GUARD__
    RETURNING d.id, d.state, d.last_error, t.event, t.detail, t.reason,
              -- the full row only where a dead letter needs it: building it is not free
              CASE WHEN t.state IN ('dead', 'expired') THEN to_jsonb(d.*) END AS snapshot
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, event, state, detail FROM u
), dl AS (
    INSERT INTO postlane_dead_letters
        (delivery_id, reason, snapshot, last_response, attempt_history)
    SELECT u.id, COALESCE(u.reason, u.state), u.snapshot, u.last_error,
           COALESCE((SELECT jsonb_agg(e.data || jsonb_build_object('at', e.at) ORDER BY e.id)
                     FROM postlane_events e
                     WHERE e.delivery_id = u.id AND e.data ? 'outcome'), '[]'::jsonb)
           || CASE WHEN u.detail ? 'outcome'
                   THEN jsonb_build_array(u.detail || jsonb_build_object('at', now()))
                   ELSE '[]'::jsonb END
    FROM u WHERE u.state IN ('dead', 'expired')
    ON CONFLICT (delivery_id) DO UPDATE SET
        reason = excluded.reason, snapshot = excluded.snapshot,
        last_response = excluded.last_response, attempt_history = excluded.attempt_history,
        dead_at = excluded.dead_at, discarded_at = NULL, discard_reason = NULL
)
SELECT id FROM u
"""
# The guard is "sending and leased to me": the table's CHECK constraint makes
# ``lease_owner IS NOT NULL`` equivalent to ``state = 'sending'``, and leaving the state
# out keeps the planner on primary-key lookups instead of the partial index of leased rows
# (which it prefers, badly, while a freshly loaded table has no statistics).
_LEASED_TO_ME = "d.lease_owner = %(owner)s"
_SET_STATE_IF_SENDING = _SET_STATE_TEMPLATE.replace("__GUARD__", _LEASED_TO_ME)
_SET_STATE_IF_AMBIGUOUS = _SET_STATE_TEMPLATE.replace("__GUARD__", "d.state = 'ambiguous'")

_RESCUE = """
WITH picked AS (
    SELECT id, lease_owner, attempt_started_at IS NOT NULL AS started
    FROM postlane_deliveries
    WHERE state = 'sending' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE postlane_deliveries d SET
        state = CASE WHEN p.started THEN 'ambiguous' ELSE 'pending' END,
        attempts = d.attempts + CASE WHEN p.started THEN 1 ELSE 0 END,
        last_error = CASE WHEN p.started
                          THEN 'lease expired after the attempt started; the provider may '
                               || 'have accepted it'
                          ELSE d.last_error END,
        lease_owner = NULL, lease_expires_at = NULL, attempt_started_at = NULL,
        updated_at = now()
    FROM picked p WHERE d.id = p.id
    RETURNING d.id, d.state, d.attempts, p.lease_owner, p.started
), ev AS (
    -- A started attempt that never reported is part of the attempt history (as ambiguous).
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'lease_expired', state,
           jsonb_build_object('owner', lease_owner, 'attempt_started', started)
           || CASE WHEN started THEN jsonb_build_object(
                  'outcome', 'ambiguous', 'attempt', attempts,
                  'response', 'lease expired after the attempt started')
              ELSE '{}'::jsonb END
    FROM u
)
SELECT id, state FROM u
"""

_REPLAY = """
WITH dl AS (
    UPDATE postlane_dead_letters dl
    SET replayed_at = now(), replayed_by = %(by)s, replay_count = dl.replay_count + 1
    FROM postlane_deliveries d
    WHERE dl.delivery_id = ANY(%(ids)s::bigint[]) AND d.id = dl.delivery_id
      AND d.state IN ('dead', 'expired') AND dl.discarded_at IS NULL
    RETURNING dl.delivery_id, dl.replay_count
), u AS (
    UPDATE postlane_deliveries d
    SET state = 'pending', attempts = 0, run_at = now(), dead_reason = NULL,
        finished_at = NULL, updated_at = now()
    FROM dl WHERE d.id = dl.delivery_id
    RETURNING d.id, dl.replay_count
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'replayed', 'pending',
           jsonb_build_object('by', %(by)s::text, 'replay', replay_count) FROM u
)
SELECT id FROM u
"""
_DISCARD = """
WITH dl AS (
    UPDATE postlane_dead_letters dl SET discarded_at = now(), discard_reason = %(reason)s
    FROM postlane_deliveries d
    WHERE dl.delivery_id = %(id)s AND d.id = dl.delivery_id
      AND d.state IN ('dead', 'expired') AND dl.discarded_at IS NULL
    RETURNING dl.delivery_id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT delivery_id, 'discarded', NULL,
           jsonb_build_object('by', %(by)s::text, 'reason', %(reason)s::text) FROM dl
)
SELECT delivery_id FROM dl
"""

_CANCEL = """
WITH u AS (
    UPDATE postlane_deliveries SET state = 'cancelled', finished_at = now(), updated_at = now()
    WHERE id = %(id)s AND state IN ('pending', 'ambiguous')
    RETURNING id
), ev AS (
    INSERT INTO postlane_events (delivery_id, kind, state, data)
    SELECT id, 'cancelled', 'cancelled', jsonb_build_object('reason', %(reason)s::text) FROM u
)
SELECT id FROM u
"""
_PRUNE = """
WITH gone AS (
    DELETE FROM postlane_deliveries WHERE id IN (
        SELECT id FROM postlane_deliveries
        WHERE finished_at IS NOT NULL AND (
            (state IN ('sent', 'expired', 'cancelled', 'suppressed')
                AND finished_at < now() - make_interval(secs => %(finished_s)s::float8))
            OR (state = 'dead'
                AND finished_at < now() - make_interval(secs => %(dead_s)s::float8)))
        LIMIT 5000
    ) RETURNING id
), timeline AS (
    -- The timeline has no foreign key (it would be checked on every event insert, the hot
    -- path); deliveries and their events go together here instead.
    DELETE FROM postlane_events WHERE delivery_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone
"""


_JSON = json.JSONDecoder()


def _json_loads(data: bytes | str) -> Any:
    """jsonb from the server: ``{}`` (most headers and metadata) without parsing, the rest
    without ``json.loads``' encoding sniffing and whitespace scans (PostgreSQL writes none
    before the value): ``json.loads`` was the largest part of a claim's client time."""
    if data == b"{}":
        return {}
    text = data.decode() if isinstance(data, bytes) else data
    return _JSON.raw_decode(text)[0]


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(_json_loads, conn)


class PostgresStore(Store):
    engine = "postgres"

    def __init__(
        self,
        url: str,
        *,
        limits: Limits | None = None,
        min_size: int = 1,
        max_size: int = 4,
    ) -> None:
        super().__init__(limits)
        self.url = url
        self._pool = AsyncConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False,
            kwargs={"autocommit": True}, configure=_configure,
        )
        self._wakeup = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None

    async def open(self) -> None:
        try:
            await self._pool.open(wait=True, timeout=10)
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {exc}") from exc

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        await self._pool.close()

    # -- migrations ------------------------------------------------------------------------
    async def _applied(self, conn: psycopg.AsyncConnection[Any]) -> set[int]:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {migrations.MIGRATIONS_TABLE} ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        cur = await conn.execute(f"SELECT version FROM {migrations.MIGRATIONS_TABLE}")
        return {row[0] for row in await cur.fetchall()}

    async def migrate(self) -> list[str]:
        applied: list[str] = []
        async with self._pool.connection() as conn, conn.transaction():
            # One migrator at a time across every host.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('postlane_migrate'))")
            done = await self._applied(conn)
            for migration in migrations.load(self.engine):
                if migration.version in done:
                    continue
                await conn.execute(migration.sql.encode())
                await conn.execute(
                    f"INSERT INTO {migrations.MIGRATIONS_TABLE} (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
                applied.append(migration.label)
        return applied

    async def pending_migrations(self) -> list[str]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (migrations.MIGRATIONS_TABLE,)
            )
            row = await cur.fetchone()
            done: set[int] = set()
            if row and row[0]:
                cur = await conn.execute(f"SELECT version FROM {migrations.MIGRATIONS_TABLE}")
                done = {r[0] for r in await cur.fetchall()}
        return [m.label for m in migrations.load(self.engine) if m.version not in done]

    # -- producing -------------------------------------------------------------------------
    async def enqueue(self, message: Message) -> EnqueueResult:
        validate(message, self.limits)
        async with self._pool.connection() as conn:
            result = await enqueue_on_connection(conn, message)
        self._wakeup.set()
        return result

    async def enqueue_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        for message in messages:
            validate(message, self.limits)
        if not messages:
            return []
        async with self._pool.connection() as conn:
            results = await enqueue_many_on_connection(conn, messages)
        self._wakeup.set()
        return results

    # -- the worker's path -----------------------------------------------------------------
    async def claim_batch(
        self, lane: str, limit: int, owner: str, lease: timedelta,
        exclude_imports: Sequence[str] = (),
    ) -> list[Delivery]:
        params = {"lane": lane, "limit": limit, "owner": owner,
                  "lease_s": lease.total_seconds(), "exclude_imports": list(exclude_imports)}
        async with self._pool.connection() as conn:
            # Never prepared: a generic plan of this statement is ten times slower.
            cur = await conn.execute(_CLAIM, params, prepare=False)
            rows = await cur.fetchall()
        return [_delivery(row) for row in rows]

    async def start_attempts(self, owner: str, claims: Sequence[Claim]) -> set[int]:
        return await self._ids(_START, owner, claims, {})

    async def renew_leases(
        self, owner: str, claims: Sequence[Claim], lease: timedelta
    ) -> set[int]:
        return await self._ids(_RENEW, owner, claims, {"lease_s": lease.total_seconds()})

    async def _ids(
        self, sql: str, owner: str, claims: Sequence[Claim], extra: dict[str, Any]
    ) -> set[int]:
        if not claims:
            return set()
        params = {"owner": owner, "ids": [c.id for c in claims],
                  "claims": [c.claims for c in claims], **extra}
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
            {"id": t.id, "claims": t.claims, "state": str(t.state), "delay_s": t.delay_s,
             "spend": 1 if t.spend_attempt else 0, "error": bound_response(t.error),
             "pmid": t.provider_message_id, "reason": t.dead_reason, "event": t.event,
             "detail": dict(t.detail)}
            for t in transitions
        ]
        params = {"owner": owner, "batch": json.dumps(batch)}
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            return {row[0] for row in await cur.fetchall()}

    async def list_ambiguous(
        self, limit: int = 100, lanes: Sequence[str] | None = None
    ) -> list[Delivery]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLS} FROM postlane_deliveries WHERE state = 'ambiguous' "
                "AND (%s::text[] IS NULL OR lane = ANY(%s::text[])) "
                "ORDER BY updated_at, id LIMIT %s",
                (None if lanes is None else list(lanes), None if lanes is None else list(lanes),
                 limit),
            )
            return [_delivery(row) for row in await cur.fetchall()]

    async def rescue_expired_leases(self, limit: int = 1000) -> RescueResult:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_RESCUE, {"limit": limit})
            rows = await cur.fetchall()
        return RescueResult(
            requeued=sorted(r[0] for r in rows if r[1] == State.PENDING),
            ambiguous=sorted(r[0] for r in rows if r[1] == State.AMBIGUOUS),
        )

    async def wait_for_work(self, timeout: float) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen())
        if not self._wakeup.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
        self._wakeup.clear()

    async def _listen(self) -> None:
        """Hold one connection on LISTEN; reconnect after a drop (polling covers the gap)."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._wakeup.set()  # anything enqueued while we were not listening
                    async for _ in conn.notifies():
                        self._wakeup.set()
            except psycopg.Error:
                await asyncio.sleep(1.0)

    # -- controls shared by the fleet ------------------------------------------------------
    async def get_controls(self) -> dict[str, Control]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT name, value, version, updated_at FROM postlane_controls"
            )
            return {row[0]: Control(*row) for row in await cur.fetchall()}

    async def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        async with self._pool.connection() as conn:
            if value is None:
                await conn.execute("DELETE FROM postlane_controls WHERE name = %s", (name,))
                return
            await conn.execute(
                "INSERT INTO postlane_controls (name, value) VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                "version = postlane_controls.version + 1, updated_at = now()",
                (name, Jsonb(dict(value))),
            )

    async def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        async with self._pool.connection() as conn:
            if expected_version is None:
                cur = await conn.execute(
                    "INSERT INTO postlane_controls (name, value) VALUES (%s, %s) "
                    "ON CONFLICT (name) DO NOTHING RETURNING name", (name, Jsonb(dict(value)))
                )
            else:
                cur = await conn.execute(
                    "UPDATE postlane_controls SET value = %s, version = version + 1, "
                    "updated_at = now() WHERE name = %s AND version = %s RETURNING name",
                    (Jsonb(dict(value)), name, expected_version),
                )
            return await cur.fetchone() is not None

    # -- reading and operating -------------------------------------------------------------
    async def get(self, id_or_key: int | str) -> Delivery | None:
        column = "id" if isinstance(id_or_key, int) else "idempotency_key"
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLS} FROM postlane_deliveries WHERE {column} = %s", (id_or_key,)
            )
            row = await cur.fetchone()
        return _delivery(row) if row else None

    async def timeline(self, delivery_id: int) -> list[Event]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, delivery_id, at, kind, state, data FROM postlane_events "
                "WHERE delivery_id = %s ORDER BY id", (delivery_id,)
            )
            return [Event(*row) for row in await cur.fetchall()]

    async def dead_letter(self, delivery_id: int) -> DeadLetter | None:
        found = await self._dead_letters("dl.delivery_id = %(id)s", {"id": delivery_id}, 1)
        return found[0] if found else None

    async def list_dead_letters(
        self, selection: DeadLetterFilter = DeadLetterFilter(), limit: int = 100
    ) -> list[DeadLetter]:
        where, params = selection.where(lambda name: f"%({name})s", lambda when: when)
        return await self._dead_letters(where, params, limit)

    async def _dead_letters(self, where: str, params: dict[str, Any],
                            limit: int) -> list[DeadLetter]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {DEAD_LETTER_COLUMNS} FROM postlane_dead_letters dl "
                f"JOIN postlane_deliveries d ON d.id = dl.delivery_id WHERE {where} "
                f"ORDER BY dl.dead_at, dl.delivery_id LIMIT %(limit)s",
                {**params, "limit": limit},
            )
            return [DeadLetter(*row) for row in await cur.fetchall()]

    async def replay_dead_letters(self, ids: Sequence[int], by: str) -> set[int]:
        if not ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute(_REPLAY, {"ids": list(ids), "by": by})
            return {row[0] for row in await cur.fetchall()}

    async def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_DISCARD, {"id": delivery_id, "reason": reason, "by": by})
            return await cur.fetchone() is not None

    async def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        conditions, params = _find_conditions(key, recipient, import_id, "%({})s")
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLS} FROM postlane_deliveries WHERE {conditions} "
                f"ORDER BY id DESC LIMIT %(limit)s", {**params, "limit": limit},
            )
            return [_delivery(row) for row in await cur.fetchall()]

    async def stats(self) -> Stats:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT lane, count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0) "
                "FROM postlane_deliveries WHERE state IN ('pending', 'sending') GROUP BY lane"
            )
            lanes = {name: LaneStats(0, 0.0) for name in self.limits.lanes}
            for lane, depth, age in await cur.fetchall():
                lanes[lane] = LaneStats(int(depth), max(0.0, float(age)))
            cur = await conn.execute(
                "SELECT state, count(*) FROM postlane_deliveries GROUP BY state"
            )
            states = {str(s): 0 for s in State}
            states.update({s: int(n) for s, n in await cur.fetchall()})
            cur = await conn.execute(
                "SELECT attempts + 1, count(*) FROM postlane_deliveries "
                "WHERE state IN ('pending', 'sending') GROUP BY 1 ORDER BY 1"
            )
            attempts = {str(a): int(n) for a, n in await cur.fetchall()}
            cur = await conn.execute(
                "SELECT dl.reason, count(*) FROM postlane_dead_letters dl "
                "JOIN postlane_deliveries d ON d.id = dl.delivery_id "
                "WHERE dl.discarded_at IS NULL AND d.state IN ('dead', 'expired') "
                "GROUP BY dl.reason"
            )
            dead = {r: int(n) for r, n in await cur.fetchall()}
        return Stats(lanes=lanes, states=states, attempts=attempts, dead_letters=dead)

    async def cancel(self, delivery_id: int, reason: str = "") -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CANCEL, {"id": delivery_id, "reason": reason})
            return await cur.fetchone() is not None

    async def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        params = {"finished_s": finished_before.total_seconds(),
                  "dead_s": dead_before.total_seconds()}
        total = 0
        async with self._pool.connection() as conn:
            while True:
                cur = await conn.execute(_PRUNE, params)
                row = await cur.fetchone()
                deleted = int(row[0]) if row else 0
                total += deleted
                if deleted < 5000:
                    return total

    # -- provider events and the suppression list -------------------------------------------
    async def record_provider_event(self, event: ProviderEvent) -> ProviderEventResult:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT id, lane, recipient FROM postlane_deliveries "
                "WHERE provider_message_id = %s ORDER BY id DESC LIMIT 1",
                (event.provider_message_id,),
            )
            found = await cur.fetchone()
            delivery_id = found[0] if found else None
            cur = await conn.execute(
                "INSERT INTO postlane_provider_events "
                "(provider, event_id, kind, provider_message_id, delivery_id) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING event_id",
                (event.provider, event.event_id, event.kind, event.provider_message_id,
                 delivery_id),
            )
            if await cur.fetchone() is None:
                return ProviderEventResult(True, delivery_id, False)
            if found is None:
                return ProviderEventResult(False, None, False)
            _, lane, recipient = found
            await conn.execute(
                "INSERT INTO postlane_events (delivery_id, kind, state, data) "
                "VALUES (%s, %s, NULL, %s)",
                (delivery_id, f"provider:{event.kind}",
                 Jsonb({"provider": event.provider, "event_id": event.event_id,
                        **dict(event.data)})),
            )
            cur = await conn.execute(
                f"UPDATE postlane_deliveries SET provider_status = %(kind)s "
                f"WHERE id = %(id)s AND {_rank('provider_status')} < {_rank('%(kind)s')} "
                f"RETURNING id", {"kind": event.kind, "id": delivery_id},
            )
            changed = await cur.fetchone() is not None
            suppressed = None
            rule = suppression_for(event, lane)
            if rule is not None:
                address = (event.recipient or recipient).lower()
                await conn.execute(
                    "INSERT INTO postlane_suppressions (address, stream, reason, delivery_id) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (address, rule[0], rule[1], delivery_id),
                )
                suppressed = address
            return ProviderEventResult(False, delivery_id, changed, suppressed)

    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO postlane_suppressions (address, stream, reason, delivery_id) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING address",
                (address.lower(), stream, reason, delivery_id),
            )
            return await cur.fetchone() is not None

    async def unsuppress(self, address: str, stream: str | None = None) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM postlane_suppressions WHERE address = %s "
                "AND (%s::text IS NULL OR stream = %s)", (address.lower(), stream, stream),
            )
            return cur.rowcount

    async def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT address, stream, reason, delivery_id, created_at "
                "FROM postlane_suppressions WHERE (%s::text IS NULL OR address = %s) "
                "ORDER BY created_at DESC LIMIT %s",
                (address and address.lower(), address and address.lower(), limit),
            )
            return [Suppression(*row) for row in await cur.fetchall()]

    async def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        if not deliveries:
            return {}
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT t.id, s.reason FROM jsonb_to_recordset(%s::jsonb) "
                "AS t(id bigint, address text, lane text) "
                "JOIN postlane_suppressions s ON s.address = t.address "
                "AND s.stream IN (t.lane, '*')",
                (json.dumps([{"id": d.id, "address": d.recipient.lower(), "lane": d.lane}
                             for d in deliveries]),),
            )
            return {row[0]: row[1] for row in await cur.fetchall()}

    async def requeue_suppressed(self, address: str) -> list[int]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                """WITH u AS (
                    UPDATE postlane_deliveries SET state = 'pending', run_at = now(),
                        finished_at = NULL, updated_at = now()
                    WHERE lower(recipient) = %(address)s AND state = 'suppressed'
                    RETURNING id
                ), ev AS (
                    INSERT INTO postlane_events (delivery_id, kind, state, data)
                    SELECT id, 'unsuppressed', 'pending', '{}'::jsonb FROM u
                ) SELECT id FROM u ORDER BY id""", {"address": address.lower()},
            )
            ids = [row[0] for row in await cur.fetchall()]
        self._wakeup.set()
        return ids

    # -- templates and bulk imports ----------------------------------------------------------
    _TEMPLATE_COLS = (
        "v.name, v.version, v.subject, v.text_body, v.html_body, v.created_at, "
        "t.latest_version, t.deprecated_at IS NOT NULL"
    )
    _ADD_TEMPLATE = f"""
    WITH t AS (
        INSERT INTO postlane_templates AS tp (name, latest_version) VALUES (%(name)s, 1)
        ON CONFLICT (name) DO UPDATE SET latest_version = tp.latest_version + 1,
            deleted_at = NULL, updated_at = now()
        RETURNING name, latest_version, deprecated_at
    ), v AS (
        INSERT INTO postlane_template_versions (name, version, subject, text_body, html_body)
        SELECT name, latest_version, %(subject)s, %(text)s, %(html)s FROM t
        RETURNING name, version, subject, text_body, html_body, created_at
    )
    SELECT {_TEMPLATE_COLS} FROM v, t
    """
    _GET_TEMPLATE = f"""
    SELECT {_TEMPLATE_COLS} FROM postlane_templates t
    JOIN postlane_template_versions v ON v.name = t.name
    WHERE t.name = %(name)s AND t.deleted_at IS NULL
      AND v.version = COALESCE(%(version)s::int, t.latest_version)
    """
    # Held until the enqueueing transaction ends: delete and deprecate wait for it.
    _GET_TEMPLATE_FOR_ENQUEUE = _GET_TEMPLATE + " FOR SHARE OF t"
    _LOCK_TEMPLATE_FOR_ENQUEUE = (
        "SELECT deprecated_at IS NOT NULL FROM postlane_templates "
        "WHERE name = %s AND deleted_at IS NULL FOR SHARE"
    )
    _COUNT_TEMPLATE_REFERENCES = (
        "SELECT count(*) FROM postlane_deliveries d "
        f"WHERE d.template_id = %s AND {TEMPLATE_REFERENCE_CONDITION}"
    )
    _IMPORT_PROGRESS = """
    UPDATE postlane_imports SET rows_read = %(read)s, rows_enqueued = %(enqueued)s,
        rows_skipped = %(skipped)s, rows_created = rows_created + %(created)s,
        finished_at = CASE WHEN %(finished)s THEN now() ELSE NULL END, updated_at = now()
    WHERE import_id = %(id)s
    """

    async def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        async with self._pool.connection() as conn:
            cur = await conn.execute(self._ADD_TEMPLATE, {"name": name, "subject": subject,
                                                          "text": text, "html": html})
            row = await cur.fetchone()
        assert row is not None
        return TemplateVersion(*row)

    async def get_template(self, name: str, version: int | None = None) -> TemplateVersion | None:
        async with self._pool.connection() as conn:
            return await self.template_on_connection(conn, name, version, lock=False)

    @classmethod
    async def template_on_connection(
        cls, conn: psycopg.AsyncConnection[Any], name: str, version: int | None = None,
        *, lock: bool = True,
    ) -> TemplateVersion | None:
        """Read a template version in the caller's transaction; ``lock`` keeps a concurrent
        delete or deprecate waiting until that transaction ends."""
        sql = cls._GET_TEMPLATE_FOR_ENQUEUE if lock else cls._GET_TEMPLATE
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(sql, {"name": name, "version": version})
            row = await cur.fetchone()
        return TemplateVersion(*row) if row else None

    @classmethod
    def template_on_sync_connection(
        cls, conn: psycopg.Connection[Any], name: str, version: int | None = None
    ) -> TemplateVersion | None:
        """``template_on_connection`` for a synchronous psycopg connection (the outbox)."""
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(cls._GET_TEMPLATE_FOR_ENQUEUE, {"name": name, "version": version})
            row = cur.fetchone()
        return TemplateVersion(*row) if row else None

    async def list_templates(self) -> list[TemplateVersion]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {self._TEMPLATE_COLS} FROM postlane_templates t "
                "JOIN postlane_template_versions v "
                "ON v.name = t.name AND v.version = t.latest_version "
                "WHERE t.deleted_at IS NULL ORDER BY t.name"
            )
            return [TemplateVersion(*row) for row in await cur.fetchall()]

    async def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE postlane_templates SET deprecated_at = CASE WHEN %(on)s "
                "THEN COALESCE(deprecated_at, now()) END, updated_at = now() "
                "WHERE name = %(name)s AND deleted_at IS NULL RETURNING name",
                {"on": deprecated, "name": name},
            )
            return await cur.fetchone() is not None

    async def count_template_references(self, name: str) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,))
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT 1 FROM postlane_templates WHERE name = %s AND deleted_at IS NULL "
                "FOR UPDATE", (name,),
            )
            if await cur.fetchone() is None:
                return TemplateDeletion(found=False, deleted=False, references=0)
            cur = await conn.execute(self._COUNT_TEMPLATE_REFERENCES, (name,))
            row = await cur.fetchone()
            references = int(row[0]) if row else 0
            if references:
                return TemplateDeletion(found=True, deleted=False, references=references)
            await conn.execute("DELETE FROM postlane_template_versions WHERE name = %s", (name,))
            await conn.execute(
                "UPDATE postlane_templates SET deleted_at = now(), deprecated_at = NULL, "
                "updated_at = now() WHERE name = %s", (name,),
            )
        return TemplateDeletion(found=True, deleted=True, references=0)

    async def enqueue_many_if_template_usable(
        self, template: str, messages: Sequence[Message],
        progress: ImportProgress | None = None, *, validated: bool = False,
    ) -> list[EnqueueResult]:
        for message in messages:
            if not validated:
                validate(message, self.limits)
            check_template_id(message, template)
        results: list[EnqueueResult] = []
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(self._LOCK_TEMPLATE_FOR_ENQUEUE, (template,))
            row = await cur.fetchone()
            if row is None:
                raise UnknownTemplate(f"unknown template {template!r}", field="template_id")
            if row[0]:
                raise TemplateDeprecated(
                    f"template {template!r} is deprecated: it takes no new enqueues",
                    field="template_id")
            if messages:
                results = await enqueue_many_on_connection(conn, messages)
            if progress is not None:
                await conn.execute(self._IMPORT_PROGRESS, {
                    "id": progress.import_id, "read": progress.rows_read,
                    "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                    "created": sum(1 for r in results if r.created), "finished": False})
        if messages:
            self._wakeup.set()
        return results

    async def start_import(
        self, import_id: str, template: str, template_version: int, file_name: str, lane: str
    ) -> ImportRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO postlane_imports AS i "
                "(import_id, template, template_version, file_name, lane) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (import_id) DO UPDATE SET "
                "runs = i.runs + 1, last_started_at = now(), finished_at = NULL, "
                "template_version = excluded.template_version, file_name = excluded.file_name, "
                "lane = excluded.lane, rows_read = 0, rows_enqueued = 0, rows_created = 0, "
                "rows_skipped = 0, updated_at = now() WHERE i.template = excluded.template "
                f"RETURNING {IMPORT_COLUMNS}",
                (import_id, template, template_version, file_name, lane),
            )
            row = await cur.fetchone()
        return ImportRecord(*row) if row else None

    async def finish_import(self, progress: ImportProgress) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(self._IMPORT_PROGRESS, {
                "id": progress.import_id, "read": progress.rows_read,
                "enqueued": progress.rows_enqueued, "skipped": progress.rows_skipped,
                "created": 0, "finished": True})

    async def get_import(self, import_id: str) -> ImportRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {IMPORT_COLUMNS} FROM postlane_imports WHERE import_id = %s",
                (import_id,))
            row = await cur.fetchone()
        return ImportRecord(*row) if row else None

    async def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {IMPORT_COLUMNS} FROM postlane_imports "
                "ORDER BY last_started_at DESC, import_id LIMIT %s", (limit,))
            return [ImportRecord(*row) for row in await cur.fetchall()]

    async def import_counts(self, import_id: str) -> ImportCounts:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT state, attempts > 0, count(*), "
                "EXTRACT(EPOCH FROM now() - min(created_at))::float8 "
                "FROM postlane_deliveries WHERE import_id = %s GROUP BY 1, 2", (import_id,))
            return import_counts_from_rows(await cur.fetchall())

    # -- the HTTP API: keys, and requests made idempotent by their body -------------------
    async def enqueue_request(
        self, message: Message, request_hash: str
    ) -> tuple[EnqueueResult, str | None]:
        validate(message, self.limits)
        async with self._pool.connection() as conn, conn.transaction():
            result = await enqueue_on_connection(conn, message)
            if result.created:
                await conn.execute(
                    "UPDATE postlane_deliveries SET request_hash = %s WHERE id = %s",
                    (request_hash, result.id))
                stored: str | None = request_hash
            else:
                cur = await conn.execute(
                    "SELECT request_hash FROM postlane_deliveries WHERE id = %s", (result.id,))
                row = await cur.fetchone()
                stored = row[0] if row else None
        self._wakeup.set()
        return result, stored

    async def create_api_key(
        self, name: str, prefix: str, token_hash: str, scopes: Sequence[str]
    ) -> ApiKey:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO postlane_api_keys (name, prefix, token_hash, scopes) "
                f"VALUES (%s, %s, %s, %s) RETURNING {_API_KEY_COLS}",
                (name, prefix, token_hash, ",".join(scopes)))
            row = await cur.fetchone()
        assert row is not None
        return _api_key(row)

    async def get_api_key(
        self, *, key_id: int | None = None, token_hash: str | None = None
    ) -> ApiKey | None:
        column, value = ("id", key_id) if key_id is not None else ("token_hash", token_hash)
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_API_KEY_COLS} FROM postlane_api_keys WHERE {column} = %s", (value,))
            row = await cur.fetchone()
        return _api_key(row) if row else None

    async def list_api_keys(self) -> list[ApiKey]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_API_KEY_COLS} FROM postlane_api_keys ORDER BY id")
            return [_api_key(row) for row in await cur.fetchall()]

    async def revoke_api_key(self, key_id: int) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE postlane_api_keys SET revoked_at = now() "
                "WHERE id = %s AND revoked_at IS NULL RETURNING id", (key_id,))
            return await cur.fetchone() is not None


def _rank(expression: str) -> str:
    """SQL for STATUS_RANK of an expression (-1 when NULL or unknown)."""
    cases = " ".join(f"WHEN '{k}' THEN {v}" for k, v in STATUS_RANK.items())
    return f"(CASE {expression} {cases} ELSE -1 END)"


async def enqueue_on_connection(
    conn: psycopg.AsyncConnection[Any], message: Message
) -> EnqueueResult:
    """Insert-or-find inside whatever transaction ``conn`` is in (the outbox's core)."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        for _ in range(3):
            await cur.execute(INSERT_ONE, message_params(message))
            row = await cur.fetchone()
            if row:
                return EnqueueResult(row[0], message.key, created=True)
            # The key exists; under READ COMMITTED a fresh statement sees the winner's row.
            await cur.execute(SELECT_ID_BY_KEY, (message.key,))
            row = await cur.fetchone()
            if row:
                return EnqueueResult(row[0], message.key, created=False)
    raise StoreError(
        f"key {message.key!r} conflicts with a row this transaction cannot see "
        "(is it REPEATABLE READ or SERIALIZABLE?); retry the transaction"
    )


async def enqueue_many_on_connection(
    conn: psycopg.AsyncConnection[Any], messages: Sequence[Message]
) -> list[EnqueueResult]:
    """Insert-or-find a batch inside whatever transaction ``conn`` is in.

    The fast path COPYs the new rows straight into the table, with ids reserved from its
    sequence, and then their events. A key that exists already (or that a concurrent
    transaction commits meanwhile) makes that COPY fail on the unique key: it is rolled back
    to a savepoint and the batch goes the slower insert-or-find way
    (:func:`_enqueue_many_staged`). A batch that conflicts on its first row (a re-run import)
    fails at once, so the wasted work is a round trip.
    """
    first: dict[str, Message] = {}
    for message in messages:
        first.setdefault(message.key, message)
    async with _atomic(conn), conn.cursor() as cur:
        # The first statement begins the caller's transaction if it has not begun yet, so
        # the savepoint below nests in it.
        await cur.execute(_RESERVE_IDS, (len(first),))
        row = await cur.fetchone()
        assert row is not None
        now, reserved = row
        fresh = dict(zip(first, sorted(reserved), strict=True))
        try:
            async with conn.transaction():  # a savepoint: a conflict rolls back to here
                await _copy_new(cur, now, [(id_, first[key]) for key, id_ in fresh.items()])
        except psycopg.errors.UniqueViolation:
            return await _enqueue_many_staged(cur, messages)
    return enqueue_results(messages, fresh, {})


def _atomic(conn: psycopg.AsyncConnection[Any]) -> contextlib.AbstractAsyncContextManager[Any]:
    """One transaction for the batch that never ends the caller's: on an autocommit
    connection (the store's own) a transaction of its own; otherwise the caller's. (psycopg's
    ``transaction()`` on a connection whose transaction has not begun yet would BEGIN and
    COMMIT it, committing the caller's business write early.)"""
    return conn.transaction() if conn.autocommit else contextlib.nullcontext()


async def _copy_new(
    cur: psycopg.AsyncCursor[Any], now: datetime, fresh: Iterable[tuple[int, Message]]
) -> None:
    new_ids: list[int] = []
    async with cur.copy(_COPY_DELIVERIES) as copy:
        for id_, m in fresh:
            new_ids.append(id_)
            await copy.write_row((
                id_, m.key, m.lane, m.channel, m.to, m.sender, m.subject, m.text, m.html,
                _json(m.headers), _json(m.metadata), m.import_id, m.template_id,
                m.template_version, now + m.delay if m.delay else now,
                m.expires_at or (now + m.expires_in if m.expires_in else None),
            ))
    if new_ids:
        await cur.execute(_ENQUEUED_EVENTS, (new_ids,))


async def _enqueue_many_staged(
    cur: psycopg.AsyncCursor[Any], messages: Sequence[Message]
) -> list[EnqueueResult]:
    """COPY into a staging table, then one INSERT ... ON CONFLICT DO NOTHING: safe against
    concurrent enqueuers of the same keys, at about half the speed of the direct COPY."""
    await cur.execute(_STAGING)
    async with cur.copy(_COPY_STAGING) as copy:
        for i, message in enumerate(messages):
            await copy.write_row(_staging_row(i, message))
    await cur.execute(_INSERT_STAGED)
    created = {key: id_ for id_, key in await cur.fetchall()}
    # ON COMMIT DROP only fires at the caller's commit: drop it now so a second batch
    # in the same transaction can stage again.
    await cur.execute("DROP TABLE postlane_staging")
    missing = list({m.key for m in messages if m.key not in created})
    existing: dict[str, int] = {}
    if missing:
        await cur.execute(_SELECT_IDS_BY_KEYS, (missing,))
        existing = {key: id_ for id_, key in await cur.fetchall()}
    return enqueue_results(messages, created, existing)


_STATE_INDEX = DELIVERY_COLUMNS.index("state")


def _delivery(row: Sequence[Any]) -> Delivery:
    """DELIVERY_COLUMNS are in Delivery's field order (checked by a test), so a row maps
    positionally; only the state needs converting."""
    values = list(row)
    values[_STATE_INDEX] = State(values[_STATE_INDEX])
    return Delivery(*values)


_API_KEY_COLS = "id, name, prefix, scopes, created_at, revoked_at"


def _api_key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(s for s in row[3].split(",") if s),
                  row[4], row[5])
