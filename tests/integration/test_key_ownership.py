"""A key belongs to its producer (design contract 14), on both engines.

The capture attempt of issue 19: a send-only API client writes ``reset:4242`` first, with
its own recipient and content; the application's later ``postlane.enqueue`` of that key must
not answer ``created=False`` (the client's message would go out, the real reset never).
It raises ``KeyConflict``. The reverse (the application first), two API clients, a bulk
import and every enqueue path (outbox sync and bulk, the store's own, async psycopg) too.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import SideDB, msg, store_url, truncate_pg

import postlane
from postlane import KeyConflict, Message, open_store
from postlane.api import create_app
from postlane.api.keys import create_key
from postlane.imports import import_csv
from postlane.store import Store
from postlane.templates import add_template

RESET = "reset:4242"


def reset_message(**overrides: Any) -> Message:
    """The application's real reset."""
    fields: dict[str, Any] = {"to": "ada@example.com", "subject": "Reset your password",
                              "text": "https://app.example.com/reset/secret-token"}
    return msg(RESET, **{**fields, **overrides})


def attacker_body(**overrides: Any) -> dict[str, Any]:
    return {"to": "mallory@example.net", "subject": "Reset your password",
            "text": "https://evil.example.net/phish", **overrides}


@dataclass
class Clients:
    http: httpx.AsyncClient
    tokens: list[str]
    """Two send-only API keys."""

    async def post(self, client: int, key: str, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            "/v1/messages", json=body,
            headers={"Authorization": f"Bearer {self.tokens[client]}", "Idempotency-Key": key})


@pytest.fixture
async def clients(store: Store) -> AsyncIterator[Clients]:
    tokens = [(await create_key(store, "send", name=f"client{i}"))[1] for i in range(2)]
    app = create_app(store_url(store), sample_interval_s=0, dashboard=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            yield Clients(http, tokens)


@contextlib.contextmanager
def app_connection(store: Store) -> Iterator[Any]:
    """The application's own DB-API connection: its transaction commits at the end of the
    block, and rolls back (the connection closes uncommitted) when an error leaves it."""
    url = store_url(store)
    if store.engine == "sqlite":
        conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"))
    else:
        conn = psycopg.connect(url)
    try:
        yield conn
        conn.commit()
    finally:
        conn.close()


async def test_an_api_client_cannot_capture_the_applications_key(
    store: Store, clients: Clients, side: SideDB
) -> None:
    first = await clients.post(0, RESET, attacker_body())
    assert first.status_code == 201, first.text
    planted = first.json()["id"]
    # Every form of the application's enqueue refuses the key instead of answering with
    # the client's delivery.
    for enqueue in (lambda c: postlane.enqueue(c, reset_message()),
                    lambda c: postlane.enqueue_many(c, [msg("other:1"), reset_message()])):
        with pytest.raises(KeyConflict) as refused, app_connection(store) as conn:
            enqueue(conn)
        assert (refused.value.key, refused.value.delivery_id) == (RESET, planted)
        assert "HTTP API key" in str(refused.value) and "the application" in str(refused.value)
    with pytest.raises(KeyConflict):
        await store.enqueue(reset_message())
    with pytest.raises(KeyConflict):
        await store.enqueue_many([reset_message()])
    # Nothing of the application's was written, and the client's row is its own.
    assert side.count("postlane_deliveries") == 1
    planted_row = await store.get(RESET)
    assert planted_row is not None and planted_row.recipient == "mallory@example.net"


async def test_the_application_first_then_an_api_client_gets_409(
    store: Store, clients: Clients, side: SideDB
) -> None:
    with app_connection(store) as conn:
        mine = postlane.enqueue(conn, reset_message())
    # Even the very same content: the key is not the client's to answer for.
    for body in (attacker_body(), {"to": "ada@example.com", "subject": "Reset your password",
                                   "text": "https://app.example.com/reset/secret-token"}):
        refused = await clients.post(0, RESET, body)
        assert refused.status_code == 409, refused.text
        problem = refused.json()
        assert problem["type"].endswith("key-conflict")
        assert problem["field"] == "Idempotency-Key"
        assert f"delivery {mine.id}" in problem["detail"]
        assert "the application" in problem["detail"]
    delivery = await store.get(RESET)
    assert delivery is not None and delivery.recipient == "ada@example.com"
    assert side.count("postlane_deliveries") == 1
    # The application's own retry of the same event is still idempotent.
    with app_connection(store) as conn:
        again = postlane.enqueue(conn, reset_message())
    assert (again.id, again.created) == (mine.id, False)


async def test_one_api_client_cannot_capture_anothers_key(
    store: Store, clients: Clients, side: SideDB
) -> None:
    first = await clients.post(0, "order:9", attacker_body(to="ada@example.com"))
    assert first.status_code == 201
    other = await clients.post(1, "order:9", attacker_body(to="ada@example.com"))
    assert other.status_code == 409 and other.json()["type"].endswith("key-conflict")
    assert "HTTP API key #" in other.json()["detail"]
    repeat = await clients.post(0, "order:9", attacker_body(to="ada@example.com"))
    assert repeat.status_code == 201 and repeat.headers["Idempotent-Replayed"] == "true"
    assert repeat.json()["id"] == first.json()["id"]
    assert side.count("postlane_deliveries") == 1


async def test_the_same_producer_with_other_content_is_a_conflict(
    store: Store, side: SideDB
) -> None:
    with app_connection(store) as conn:
        first = postlane.enqueue(conn, reset_message())
        same = postlane.enqueue(conn, reset_message(lane="bulk", metadata={"retry": 1}))
    assert (same.id, same.created) == (first.id, False)  # lane, metadata: not content
    for changed in (reset_message(to="eve@example.com"), reset_message(text="another link"),
                    reset_message(headers={"X-Campaign": "b"}), reset_message(html="<p>x</p>")):
        with pytest.raises(KeyConflict) as refused, app_connection(store) as conn:
            postlane.enqueue(conn, changed)
        assert "other content" in str(refused.value)
    # In one batch: the same key twice with different content, before anything is written.
    with pytest.raises(KeyConflict) as refused, app_connection(store) as conn:
        postlane.enqueue_many(conn, [msg("dup:1"), msg("dup:1", to="eve@example.com")])
    assert refused.value.delivery_id == 0
    assert side.count("postlane_deliveries") == 1


async def test_async_psycopg_enqueue_refuses_a_captured_key(pg_url: str) -> None:
    async with open_store(pg_url) as pg_store:
        await pg_store.migrate()
        truncate_pg(pg_url)
        key, _token = await create_key(pg_store, "send", name="client")
        await pg_store.enqueue_request(reset_message(to="mallory@example.net"), "hash",
                                       f"apikey:{key.id}")
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        with pytest.raises(KeyConflict):
            await postlane.enqueue_async(conn, reset_message())
        await conn.rollback()
        with pytest.raises(KeyConflict) as refused:
            await postlane.enqueue_many_async(conn, [msg("x:1"), reset_message(), msg("x:2")])
        assert [c[0] for c in refused.value.conflicts] == [RESET]
        await conn.rollback()
    with SideDB(pg_url) as side:
        assert side.count("postlane_deliveries") == 1


async def test_an_import_skips_rows_whose_keys_another_producer_holds(
    store: Store, tmp_path: Path, side: SideDB
) -> None:
    await add_template(store, "welcome", subject="Welcome, {{ name }}", text="Hi {{ name }}")
    with app_connection(store) as conn:  # the application wrote one of the import's keys
        postlane.enqueue(conn, msg("welcome:2:imp-1", to="someone@example.com"))
    path = tmp_path / "users.csv"
    path.write_text("user_id,email,name\n1,a@example.com,A\n2,b@example.com,B\n"
                    "3,c@example.com,C\n3,other@example.com,C2\n", encoding="utf-8")
    report = await import_csv(store, path, template="welcome", import_id="imp-1")
    assert (report.rows_read, report.rows_enqueued, report.rows_created,
            report.rows_skipped) == (4, 2, 2, 2)
    assert sorted((p.line, "the application" in p.reason or "twice" in p.reason)
                  for p in report.problems) == [(3, True), (5, True)]
    # A re-run is the same producer with the same content: nothing new, nothing refused.
    again = await import_csv(store, path, template="welcome", import_id="imp-1")
    assert (again.rows_created, again.rows_skipped) == (0, 2)
    d = await store.get("welcome:3:imp-1")
    assert d is not None and d.recipient == "c@example.com"
    assert side.count("postlane_deliveries") == 3
