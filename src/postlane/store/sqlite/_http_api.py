"""The HTTP API's storage on SQLite: API keys, and requests made idempotent by their body."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from postlane.core.message import EnqueueResult, Message
from postlane.core.records import ApiKey
from postlane.core.validation import validate
from postlane.store.sqlite._base import NOW, SQLiteEngine, _dt, _opt_dt
from postlane.store.sqlite._producing import insert_one


class HttpApiMixin(SQLiteEngine):
    # -- the HTTP API: keys, and requests made idempotent by their body -------------------
    def enqueue_request(
        self, message: Message, request_hash: str, producer: str
    ) -> tuple[EnqueueResult, str | None]:
        validate(message, self.limits)
        with self._write() as conn:
            result = insert_one(conn, message, producer, compare_content=False)
            if result.created:
                conn.execute("UPDATE postlane_messages SET request_hash = ? WHERE id = ?",
                             (request_hash, result.id))
                kept = request_hash
            else:
                kept = conn.execute("SELECT request_hash FROM postlane_messages WHERE id = ?",
                                    (result.id,)).fetchone()[0]
        self.wake()
        return result, kept

    def create_api_key(
        self, name: str, prefix: str, token_hash: str, scopes: Sequence[str]
    ) -> ApiKey:
        with self._write() as conn:
            row = conn.execute(
                f"INSERT INTO postlane_api_keys (name, prefix, token_hash, scopes, "
                f"created_at) VALUES (?, ?, ?, ?, {NOW}) RETURNING {_API_KEY_COLS}",
                (name, prefix, token_hash, ",".join(scopes)),
            ).fetchone()
        return _api_key(row)

    def get_api_key(
        self, *, key_id: int | None = None, token_hash: str | None = None
    ) -> ApiKey | None:
        column, value = ("id", key_id) if key_id is not None else ("token_hash", token_hash)
        row = self.conn.execute(
            f"SELECT {_API_KEY_COLS} FROM postlane_api_keys WHERE {column} = ?", (value,)
        ).fetchone()
        return _api_key(row) if row else None

    def list_api_keys(self) -> list[ApiKey]:
        rows = self.conn.execute(
            f"SELECT {_API_KEY_COLS} FROM postlane_api_keys ORDER BY id").fetchall()
        return [_api_key(r) for r in rows]

    def revoke_api_key(self, key_id: int) -> bool:
        with self._write() as conn:
            row = conn.execute(
                f"UPDATE postlane_api_keys SET revoked_at = {NOW} "
                "WHERE id = ? AND revoked_at IS NULL RETURNING id", (key_id,)).fetchone()
        return row is not None

    def end_api_key_sessions(self, key_id: int, before: float) -> bool:
        with self._write() as conn:
            row = conn.execute(
                "UPDATE postlane_api_keys SET sessions_after = MAX(?, "
                "COALESCE(sessions_after, 0)) WHERE id = ? RETURNING id",
                (before, key_id)).fetchone()
        return row is not None


_API_KEY_COLS = "id, name, prefix, scopes, created_at, revoked_at, sessions_after"


def _api_key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(s for s in row[3].split(",") if s),
                  _dt(row[4]), _opt_dt(row[5]), row[6])
