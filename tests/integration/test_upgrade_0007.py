"""Upgrading a deployment across migration 0007 (the narrow delivery table).

A database at 0006 is filled the way Postlane wrote it then, through its tables: a delivery
in every state (pending, sending with and without a started attempt, ambiguous, sent, dead
with its dead-letter entry, replayed, suppressed, expired, cancelled), from every producer
(the application, an import, an API key), with templates, an import run, API keys, the
timeline, provider events, suppressions and a control. ``postlane migrate`` (the real
console script) then brings it to 0007, and:

- every delivery reads back column for column as it was (through ``postlane_delivery_rows``,
  and through the store), and every other table is unchanged, row for row (on SQLite the
  deliveries table is rebuilt: its foreign keys must not have cascaded);
- keys stay unique and ids are never reused;
- the queue drains: the expired leases are rescued, a worker sends what is due.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import msg
from worker_helpers import fast_config

from postlane import State, open_store
from postlane.errors import KeyConflict
from postlane.providers.testing import RecordingProvider
from postlane.store import migrations
from postlane.worker import Worker

BEFORE = 6
TABLES = ("postlane_events", "postlane_dead_letters", "postlane_templates",
          "postlane_template_versions", "postlane_imports", "postlane_api_keys",
          "postlane_provider_events", "postlane_suppressions", "postlane_controls")
DELIVERY_COLUMNS = (
    "id, idempotency_key, lane, channel, recipient, sender, subject, text_body, html_body, "
    "headers, metadata, import_id, template_id, template_version, state, attempts, claims, "
    "run_at, expires_at, lease_owner, lease_expires_at, attempt_started_at, "
    "provider_message_id, dead_reason, last_error, created_at, updated_at, sent_at, "
    "finished_at, provider_status, request_hash, producer"
)

# key -> (state, lane, extra columns). Times are seconds relative to now (None: NULL).
ROWS: dict[str, dict[str, Any]] = {
    "up:pending": {"state": "pending", "template_id": "welcome", "template_version": 1,
                   "headers": {"X-Tag": "a"}, "metadata": {"user": 1}, "sender": "a@shop.test",
                   "html_body": "<p>hi</p>", "expires_at": 3600.0},
    "up:leased-started": {"state": "sending", "lease_owner": "w-gone", "claims": 1,
                          "lease_expires_at": -60.0, "attempt_started_at": -90.0},
    "up:leased-unstarted": {"state": "sending", "lease_owner": "w-gone", "claims": 1,
                            "lease_expires_at": -60.0},
    "up:ambiguous": {"state": "ambiguous", "attempts": 1, "claims": 1,
                     "last_error": "lease expired after the attempt started"},
    "up:sent": {"state": "sent", "attempts": 1, "claims": 1, "provider_message_id": "pm-5",
                "provider_status": "delivered", "sent_at": -30.0, "finished_at": -30.0},
    "up:dead": {"state": "dead", "attempts": 1, "claims": 1, "dead_reason": "permanent",
                "last_error": "550 no such user", "finished_at": -20.0},
    "up:replayed": {"state": "pending", "attempts": 0, "claims": 1},
    "up:suppressed": {"state": "suppressed", "finished_at": -10.0},
    "up:expired": {"state": "expired", "finished_at": -5.0, "expires_at": -6.0},
    "up:cancelled": {"state": "cancelled", "finished_at": -4.0},
    "up:import": {"state": "pending", "lane": "bulk", "import_id": "imp-1",
                  "producer": "import:imp-1", "template_id": "welcome", "template_version": 2},
    "up:api": {"state": "pending", "request_hash": "h-1", "producer": "apikey:1"},
    "up:api-legacy": {"state": "sent", "request_hash": "h-2", "sent_at": -3.0,
                      "finished_at": -3.0, "attempts": 1, "claims": 1},
}
# What a worker sends after the upgrade: the due ones, and the ambiguous ones (the recording
# provider deduplicates by key, so the worker settles them by sending again).
DUE = {"up:pending", "up:leased-unstarted", "up:replayed", "up:import", "up:api",
       "up:ambiguous", "up:leased-started"}


class Old:
    """Writes and reads the 0006 schema on either engine, as Postlane 0006 stored it."""

    def __init__(self, url: str) -> None:
        self.sqlite = url.startswith("sqlite:")
        self.url = url

    @contextmanager
    def connect(self) -> Iterator[Any]:
        if self.sqlite:
            conn = sqlite3.connect(self.url[len("sqlite:///"):], isolation_level=None)
            try:
                yield conn
            finally:
                conn.close()
        else:
            with psycopg.connect(self.url, autocommit=True) as conn:
                yield conn

    def run(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if not self.sqlite:
            sql = sql.replace("?", "%s")
        cur = conn.execute(sql, params)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def when(self, seconds: float | None) -> str:
        """SQL for now + seconds on this engine (NULL for None)."""
        if seconds is None:
            return "NULL"
        if self.sqlite:
            return f"((julianday('now') - 2440587.5) * 86400.0 + {seconds!r})"
        return f"(now() + make_interval(secs => {seconds!r}))"

    def fill(self) -> dict[str, int]:
        ids: dict[str, int] = {}
        times = ("run_at", "expires_at", "lease_expires_at", "attempt_started_at", "sent_at",
                 "finished_at")
        with self.connect() as conn:
            for n, (key, spec) in enumerate(ROWS.items()):
                values: dict[str, Any] = {
                    "idempotency_key": key, "lane": spec.get("lane", "interactive"),
                    "recipient": f"user{n}@example.com", "subject": f"Subject {n}",
                    "text_body": f"Body {n}", **spec}
                values["headers"] = json.dumps(values.get("headers", {}))
                values["metadata"] = json.dumps(values.get("metadata", {}))
                literal = {c: values.pop(c) for c in times if c in values}
                literal.setdefault("run_at", -100.0 + n)
                if self.sqlite:
                    literal["created_at"] = literal["updated_at"] = -200.0 + n
                columns = list(values) + list(literal)
                sql = (f"INSERT INTO postlane_deliveries ({', '.join(columns)}) VALUES ("
                       + ", ".join(["?"] * len(values) + [self.when(v) for v in
                                                          literal.values()])
                       + ") RETURNING id")
                ids[key] = self.run(conn, sql, tuple(values.values()))[0][0]
                self.run(conn, "INSERT INTO postlane_events (delivery_id, at, kind, state) "
                         f"VALUES (?, {self.when(-100.0)}, 'enqueued', 'pending')", (ids[key],))
            dead = ids["up:dead"]
            history = json.dumps([{"outcome": "permanent", "attempt": 1,
                                   "response": "550 no such user"}])
            self.run(conn, "INSERT INTO postlane_dead_letters (delivery_id, reason, snapshot, "
                     "last_response, attempt_history, dead_at) VALUES "
                     f"(?, 'permanent', ?, '550 no such user', ?, {self.when(-20.0)})",
                     (dead, json.dumps({"idempotency_key": "up:dead", "lane": "interactive"}),
                      history))
            self.run(conn, "INSERT INTO postlane_dead_letters (delivery_id, reason, snapshot, "
                     "attempt_history, dead_at, replayed_at, replay_count, replayed_by) VALUES "
                     f"(?, 'permanent', ?, '[]', {self.when(-50.0)}, {self.when(-40.0)}, 1, "
                     "'ops')", (ids["up:replayed"], json.dumps({"idempotency_key": "up:replayed"})))
            self.run(conn, "INSERT INTO postlane_suppressions (address, stream, reason, "
                     f"delivery_id, created_at) VALUES (?, '*', 'bounce', ?, {self.when(-10.0)})",
                     (f"user{list(ROWS).index('up:suppressed')}@example.com",
                      ids["up:suppressed"]))
            self.run(conn, "INSERT INTO postlane_provider_events (provider, event_id, kind, "
                     "provider_message_id, delivery_id, received_at) VALUES "
                     f"('ses', 'ev-1', 'delivered', 'pm-5', ?, {self.when(-25.0)})",
                     (ids["up:sent"],))
            self.run(conn, "INSERT INTO postlane_templates (name, latest_version, created_at, "
                     f"updated_at) VALUES ('welcome', 2, {self.when(-500.0)}, "
                     f"{self.when(-400.0)})")
            for version in (1, 2):
                self.run(conn, "INSERT INTO postlane_template_versions (name, version, subject, "
                         f"text_body, created_at) VALUES ('welcome', ?, ?, ?, "
                         f"{self.when(-500.0 + version)})",
                         (version, f"Welcome v{version}", "Hello {{ name }}"))
            self.run(conn, "INSERT INTO postlane_imports (import_id, template, template_version, "
                     "file_name, lane, started_at, last_started_at, rows_read, rows_enqueued, "
                     "rows_created, updated_at) VALUES ('imp-1', 'welcome', 2, 'users.csv', "
                     f"'bulk', {self.when(-300.0)}, {self.when(-300.0)}, 1, 1, 1, "
                     f"{self.when(-290.0)})")
            self.run(conn, "INSERT INTO postlane_api_keys (name, prefix, token_hash, scopes, "
                     f"created_at, sessions_after) VALUES ('ci', 'pl_ab', 'hash-1', "
                     f"'send,read', {self.when(-600.0)}, 12345.5)")
            self.run(conn, "INSERT INTO postlane_controls (name, value, updated_at) VALUES "
                     f"('lane_pause:bulk', '{{}}', {self.when(-1.0)})")
        return ids

    def columns(self, conn: Any, table: str) -> str:
        """The table's columns now: later migrations (0009, 0012) add some, which the
        comparison across the upgrade leaves out."""
        cur = conn.execute(f"SELECT * FROM {table} LIMIT 0")
        return ", ".join(d[0] for d in cur.description)

    def dump(self, conn: Any, table: str, columns: str = "*") -> list[tuple[Any, ...]]:
        order = "id" if table in ("postlane_deliveries", "postlane_delivery_rows",
                                  "postlane_events", "postlane_api_keys") else "1, 2"
        return sorted(self.run(conn, f"SELECT {columns} FROM {table} ORDER BY {order}"),
                      key=repr)


def migrate_up_to(url: str, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    load = migrations.load
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "load",
                      lambda engine: [m for m in load(engine) if m.version <= version])

        async def _migrate() -> None:
            async with open_store(url) as store:
                await store.migrate()
        import asyncio
        asyncio.run(_migrate())


def postlane_migrate(url: str) -> str:
    script = Path(sys.executable).parent / "postlane"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "postlane"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTLANE_")}
    done = subprocess.run([*command, "--db", url, "migrate"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(params=["sqlite", "postgres"])
def old_url(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("fresh_pg_url"))


def test_upgrade_keeps_every_row_and_drains(old_url: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    old = Old(old_url)
    migrate_up_to(old_url, BEFORE, monkeypatch)
    ids = old.fill()
    with old.connect() as conn:
        before = old.dump(conn, "postlane_deliveries", DELIVERY_COLUMNS)
        columns = {t: old.columns(conn, t) for t in TABLES}
        tables = {t: old.dump(conn, t, columns[t]) for t in TABLES}
    assert len(before) == len(ROWS)
    if old.sqlite:  # a copy of the 0006 file, for a failure to be looked at
        shutil.copy(old_url[len("sqlite:///"):], old_url[len("sqlite:///"):] + ".0006")

    assert "0007_narrow_deliveries" in postlane_migrate(old_url)

    with old.connect() as conn:
        assert old.dump(conn, "postlane_delivery_rows", DELIVERY_COLUMNS) == before
        for table, rows in tables.items():
            assert old.dump(conn, table, columns[table]) == rows, table
        assert len(old.dump(conn, "postlane_messages")) == len(ROWS)

    async def after() -> None:
        async with open_store(old_url) as store:
            assert await store.pending_migrations() == []
            # The store reads every delivery as it was.
            for key, spec in ROWS.items():
                d = await store.get(key)
                assert d is not None and d.id == ids[key] and d.key == key
                assert d.state == State(spec["state"])
                assert d.recipient == f"user{list(ROWS).index(key)}@example.com"
                assert d.headers == spec.get("headers", {})
                assert d.metadata == spec.get("metadata", {})
                assert (d.template_id, d.template_version) == (spec.get("template_id"),
                                                               spec.get("template_version"))
                assert d.import_id == spec.get("import_id")
            entry = await store.dead_letter(ids["up:dead"])
            assert entry is not None and entry.reason == "permanent"
            assert entry.attempt_history[0]["response"] == "550 no such user"
            template = await store.get_template("welcome", 1)
            assert template is not None and template.subject == "Welcome v1"
            imported = await store.get_import("imp-1")
            assert imported is not None and imported.rows_created == 1
            key = await store.get_api_key(token_hash="hash-1")
            assert key is not None and key.name == "ci"

            # Keys stay unique; ids go on from where they were, never reused.
            with pytest.raises(KeyConflict, match=f"delivery {ids['up:pending']} "):
                await store.enqueue(msg("up:pending", to="someone@else.test"))
            fresh = await store.enqueue(msg("up:new"))
            assert fresh.created and fresh.id > max(ids.values())

            # It drains: the expired leases are rescued, a worker sends what is due.
            rescued = await store.rescue_expired_leases()
            assert rescued.ambiguous == [ids["up:leased-started"]]
            assert rescued.requeued == [ids["up:leased-unstarted"]]
            provider = RecordingProvider()
            await Worker(store, provider, config=fast_config(drain=True)).run()
            assert sorted(s.key for s in provider.sends) == sorted(DUE | {"up:new"})
            for key in DUE | {"up:new"}:
                d = await store.get(key)
                assert d is not None and d.state == State.SENT, key
            for key in set(ROWS) - DUE:
                d = await store.get(key)
                assert d is not None and d.state == State(ROWS[key]["state"]), key
            timeline = await store.timeline(ids["up:pending"])
            assert [e.kind for e in timeline][:1] == ["enqueued"]
            assert {"claimed", "sent"} <= {e.kind for e in timeline}

    asyncio.run(after())
