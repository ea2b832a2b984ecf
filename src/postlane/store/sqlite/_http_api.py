"""The HTTP API's storage on SQLite: API keys, and requests made idempotent by their body."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from postlane.core.message import EnqueueResult, Message
from postlane.core.records import ApiKey
from postlane.core.validation import validate
from postlane.store.sqlite._base import Q, SQLiteEngine, _dt, _opt_dt
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
                conn.execute(Q["set_request_hash"], (request_hash, result.id))
                kept = request_hash
            else:
                kept = conn.execute(Q["request_hash"], (result.id,)).fetchone()[0]
        self.wake()
        return result, kept

    def create_api_key(
        self, name: str, prefix: str, token_hash: str, scopes: Sequence[str]
    ) -> ApiKey:
        with self._write() as conn:
            row = conn.execute(
                Q["create_api_key"],
                (name, prefix, token_hash, ",".join(scopes)),
            ).fetchone()
        return _api_key(row)

    def get_api_key(
        self, *, key_id: int | None = None, token_hash: str | None = None
    ) -> ApiKey | None:
        name, value = (("api_key_by_id", key_id) if key_id is not None
                       else ("api_key_by_token_hash", token_hash))
        row = self.conn.execute(Q[name], (value,)).fetchone()
        return _api_key(row) if row else None

    def list_api_keys(self) -> list[ApiKey]:
        rows = self.conn.execute(Q["list_api_keys"]).fetchall()
        return [_api_key(r) for r in rows]

    def revoke_api_key(self, key_id: int) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["revoke_api_key"], (key_id,)).fetchone()
        return row is not None

    def end_api_key_sessions(self, key_id: int, before: float) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["end_api_key_sessions"], (before, key_id)).fetchone()
        return row is not None


def _api_key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(s for s in row[3].split(",") if s),
                  _dt(row[4]), _opt_dt(row[5]), row[6])
