"""The HTTP API's part of the store: API keys, and requests made idempotent by their body."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from postlane.core.message import EnqueueResult, Message
from postlane.core.records import ApiKey
from postlane.core.validation import validate
from postlane.store.postgres._base import PostgresBase, Q
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
                await conn.execute(Q["set_request_hash"], (request_hash, result.id))
                stored: str | None = request_hash
            else:
                cur = await conn.execute(Q["request_hash"], (result.id,))
                row = await cur.fetchone()
                stored = row[0] if row else None
        self._wakeup.set()
        return result, stored

    async def create_api_key(
        self, name: str, prefix: str, token_hash: str, scopes: Sequence[str]
    ) -> ApiKey:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["create_api_key"],
                                     (name, prefix, token_hash, ",".join(scopes)))
            row = await cur.fetchone()
        assert row is not None
        return _api_key(row)

    async def get_api_key(
        self, *, key_id: int | None = None, token_hash: str | None = None
    ) -> ApiKey | None:
        sql, value = ((Q["api_key_by_id"], key_id) if key_id is not None
                      else (Q["api_key_by_token_hash"], token_hash))
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, (value,))
            row = await cur.fetchone()
        return _api_key(row) if row else None

    async def list_api_keys(self) -> list[ApiKey]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["list_api_keys"])
            return [_api_key(row) for row in await cur.fetchall()]

    async def revoke_api_key(self, key_id: int) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["revoke_api_key"], (key_id,))
            return await cur.fetchone() is not None

    async def end_api_key_sessions(self, key_id: int, before: float) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(Q["end_api_key_sessions"], (before, key_id))
            return await cur.fetchone() is not None


def _api_key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(s for s in row[3].split(",") if s),
                  row[4], row[5], row[6])
