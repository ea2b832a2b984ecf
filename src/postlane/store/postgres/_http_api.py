"""The HTTP API's part of the store: API keys, and requests made idempotent by their body."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from postlane.core.message import EnqueueResult, Message
from postlane.core.records import ApiKey
from postlane.core.validation import validate
from postlane.store.postgres._base import PostgresBase
from postlane.store.postgres._producing import enqueue_on_connection


class HttpApiMixin(PostgresBase):
    # -- the HTTP API: keys, and requests made idempotent by their body -------------------
    async def enqueue_request(
        self, message: Message, request_hash: str, producer: str
    ) -> tuple[EnqueueResult, str | None]:
        validate(message, self.limits)
        async with self._pool.connection() as conn, conn.transaction():
            result = await enqueue_on_connection(conn, message, producer,
                                                 compare_content=False)
            if result.created:
                await conn.execute(
                    "UPDATE postlane_messages SET request_hash = %s WHERE id = %s",
                    (request_hash, result.id))
                stored: str | None = request_hash
            else:
                cur = await conn.execute(
                    "SELECT request_hash FROM postlane_messages WHERE id = %s", (result.id,))
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

    async def end_api_key_sessions(self, key_id: int, before: float) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE postlane_api_keys SET sessions_after = GREATEST(%s, "
                "COALESCE(sessions_after, 0)) WHERE id = %s RETURNING id", (before, key_id))
            return await cur.fetchone() is not None


_API_KEY_COLS = "id, name, prefix, scopes, created_at, revoked_at, sessions_after"


def _api_key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(s for s in row[3].split(",") if s),
                  row[4], row[5], row[6])
