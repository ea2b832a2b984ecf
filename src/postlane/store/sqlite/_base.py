"""The SQLite store's foundation, synchronous: the connection, write transactions and
migrations, with the helpers every part of the store shares. The async ``SQLiteStore`` over
it is ``sqlite._async``.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from postlane.core.message import Delivery, delivery_of_row
from postlane.core.states import State
from postlane.core.validation import Limits
from postlane.errors import StoreConflict, StoreError, StoreUnavailable
from postlane.store import migrations, queries
from postlane.store.base import DELIVERY_COLUMNS, HINTS_AT
from postlane.store.unreadable import check_headers, check_metadata, read_columns

T = TypeVar("T")
P = ParamSpec("P")
E = TypeVar("E", bound="SQLiteEngine")

_TIME_COLUMNS = frozenset({
    "run_at", "expires_at", "lease_expires_at", "attempt_started_at", "created_at",
    "updated_at", "sent_at", "finished_at",
})

Q = queries.load("sqlite")
"""Every statement this engine runs, by name (``sql/sqlite/queries.sql``)."""


@contextmanager
def sqlite_errors() -> Iterator[None]:
    """sqlite3's exceptions as Postlane's, around every operation (``store.seam``).

    An ``OperationalError`` is the file not answering as asked: locked past the busy
    timeout, unreadable, on a full or failing disk (and a schema not migrated: "no such
    table"); a unique constraint the operation did not absorb is a conflict; anything else
    is a ``StoreError``."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        if "UNIQUE" in str(exc):
            raise StoreConflict(f"SQLite: {exc}") from exc
        raise StoreError(f"SQLite: {exc}") from exc
    except sqlite3.OperationalError as exc:
        raise StoreUnavailable(f"SQLite: {exc}") from exc
    except sqlite3.Error as exc:
        raise StoreError(f"SQLite: {exc or type(exc).__name__}") from exc


def connect(path: str) -> sqlite3.Connection:
    """A connection configured as every Postlane SQLite connection must be."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


class SQLiteEngine:
    """The SQLite store written synchronously: its methods run the SQL on ``conn`` in the
    calling thread. ``SQLiteStore`` (``sqlite._async``) runs each on the store's one thread;
    the outbox and the tests may call it directly. ``wake`` is called (in that thread) after a
    write that gives a worker something to do."""

    engine = "sqlite"

    def __init__(self, path: str, *, limits: Limits | None = None,
                 wake: Callable[[], None] | None = None) -> None:
        self.path = path
        self.limits = limits or Limits()
        self.wake: Callable[[], None] = wake or _nothing
        self._conn: sqlite3.Connection | None = None

    def open(self) -> None:
        try:
            self._conn = connect(self.path)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}"
                                   ) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

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

    def data_version(self) -> int:
        """Changes when another connection commits (``wait_for_work`` polls it)."""
        return int(self.conn.execute(Q["data_version"]).fetchone()[0])

    # -- migrations ------------------------------------------------------------------------
    def _applied(self) -> set[int]:
        self.conn.execute(Q["migrations_table"])
        rows = self.conn.execute(Q["migrations_applied"])
        return {r[0] for r in rows}

    def migrate(self) -> list[str]:
        # Foreign keys off while migrating (it cannot change inside a transaction): a
        # migration that rebuilds a table (0007) drops the old one, and with them on
        # that would delete the rows referencing it (ON DELETE CASCADE). Checked after.
        self.conn.execute("PRAGMA foreign_keys=OFF")
        try:
            return self._apply_migrations()
        finally:
            self.conn.execute("PRAGMA foreign_keys=ON")

    def _apply_migrations(self) -> list[str]:
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
                record = (Q["migration_record"].replace("__VERSION__", str(migration.version))
                          .replace("__NAME__", migration.name))
                self.conn.executescript(f"BEGIN IMMEDIATE;\n{record}{migration.sql}\nCOMMIT;")
            except sqlite3.Error:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                if migration.version in self._applied():
                    continue
                raise
            broken = self.conn.execute(Q["foreign_key_check"]).fetchall()
            if broken:
                raise StoreError(f"migration {migration.label} left rows whose foreign "
                                 f"keys point nowhere: {broken[:5]}")
            applied.append(migration.label)
        return applied

    def pending_migrations(self) -> list[str]:
        exists = self.conn.execute(Q["migrations_table_exists"]).fetchone()
        done = self._applied() if exists else set()
        return [m.label for m in migrations.load(self.engine) if m.version not in done]


def _nothing() -> None:
    pass


def tolerating_bad_text(method: Callable[Concatenate[E, P], T]) -> Callable[Concatenate[E, P], T]:
    """Run a reading method; text that is not UTF-8 (bytes another program wrote into a
    delivery) makes sqlite3 fail the whole read, and with it a whole claim, every time.
    Then the method runs again (its transaction, if any, was rolled back) reading such
    text as its decode error, which ``_read`` makes an ``UnreadableDelivery`` and a
    dead-letter snapshot keeps with the bad bytes replaced."""

    @functools.wraps(method)
    def tolerant(self: E, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.OperationalError as exc:
            if "decode to UTF-8" not in str(exc):
                raise
        self.conn.text_factory = _text_or_error
        try:
            return method(self, *args, **kwargs)
        finally:
            self.conn.text_factory = str

    return tolerant


def _dt(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _opt_dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _iso(value: float | None) -> str | None:
    return None if value is None else _dt(value).isoformat()


_DECODERS: dict[str, Callable[[Any], Any]] = {
    **{column: _opt_dt for column in _TIME_COLUMNS},
    "run_at": _dt, "created_at": _dt, "updated_at": _dt,
    "headers": json.loads, "metadata": json.loads, "state": State,
}


def _delivery(row: Sequence[Any], hinted: bool = False) -> Delivery:
    """The row as a ``Delivery``, or, when it cannot be read, as an ``UnreadableDelivery``
    (see ``postlane.store.unreadable``) rather than an error that fails its whole batch. A
    ``hinted`` row (a claim's) ends with ``may_be_suppressed`` and ``has_attachments``."""
    try:
        if hinted:
            return _decode(row[:HINTS_AT], may_be_suppressed=bool(row[HINTS_AT]),
                           has_attachments=bool(row[HINTS_AT + 1]))
        return _decode(row)
    except Exception as exc:
        row = row[:HINTS_AT]
        return read_columns(dict(zip(DELIVERY_COLUMNS, row, strict=True)), _DECODERS, exc)


def _text_or_error(data: bytes) -> str | UnicodeDecodeError:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        return exc


def _read(conn: sqlite3.Connection, row: Sequence[Any], hinted: bool = False) -> Delivery:
    """``_delivery``, also for a row read while tolerating bad text: a column that is not
    UTF-8 makes it an ``UnreadableDelivery`` (see ``_tolerating_bad_text``)."""
    if conn.text_factory is not str:
        bad = next((v for v in row if isinstance(v, UnicodeDecodeError)), None)
        if bad is not None:
            return read_columns(dict(zip(DELIVERY_COLUMNS, row[:HINTS_AT], strict=True)),
                                _DECODERS, bad)
    return _delivery(row, hinted)


def _decode(row: Sequence[Any], *, may_be_suppressed: bool = True,
            has_attachments: bool | None = None) -> Delivery:
    # Unpacked by position (DELIVERY_COLUMNS' order, checked by a test): a dict per row was
    # a measurable part of a claim's client time.
    (id_, key, lane, channel, recipient, sender, subject, text, html, headers, metadata,
     import_id, template_id, template_version, state, attempts, claims, run_at, expires_at,
     lease_owner, lease_expires_at, attempt_started_at, provider_message_id, dead_reason,
     last_error, created_at, updated_at, sent_at, finished_at) = row
    headers = {} if headers == "{}" else json.loads(headers)
    metadata = {} if metadata == "{}" else json.loads(metadata)
    check_headers(headers)
    check_metadata(metadata)
    return delivery_of_row((
        id_, key, lane, channel, recipient, sender, subject, text, html, headers, metadata,
        import_id, template_id, template_version, State(state), attempts, claims,
        _dt(run_at), _opt_dt(expires_at), lease_owner, _opt_dt(lease_expires_at),
        _opt_dt(attempt_started_at), provider_message_id, dead_reason, last_error,
        _dt(created_at), _dt(updated_at), _opt_dt(sent_at), _opt_dt(finished_at),
    ), may_be_suppressed, has_attachments)
