"""Templates on both engines: versions, rendering once at enqueue, and what a retry or a
replay sends after the template (and the data it was rendered from) changed."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from conftest import SideDB, msg, store_url, truncate_pg
from worker_helpers import delivery_when, fast_config, in_state, running, wait_until

from postlane import State, open_store
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.errors import (
    TemplateDeprecated,
    TemplateError,
    TemplateInUse,
    UnknownTemplate,
)
from postlane.providers.testing import RecordingProvider
from postlane.store import Store, Transition
from postlane.templates import (
    add_template,
    delete_template,
    deprecate_template,
    enqueue_template,
    enqueue_template_in_transaction,
    enqueue_template_in_transaction_async,
    render_message,
    render_message_in_transaction,
)
from postlane.worker import Worker


@pytest.fixture
async def tstore(store: Store) -> AsyncIterator[Store]:
    """The ``store`` fixture (whose reset on PostgreSQL empties the template and import
    tables too)."""
    yield store


class ContentProvider(RecordingProvider):
    """Records what each attempt carried, and can run a hook before its first answer."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.contents: list[tuple[str, str, str | None, str | None, int | None]] = []

    async def send(self, delivery: Delivery) -> Outcome:
        self.contents.append((delivery.key, delivery.subject, delivery.text, delivery.html,
                              delivery.template_version))
        return await super().send(delivery)


async def welcome(store: Store) -> None:
    await add_template(store, "welcome", subject="Welcome, {{ name }}",
                       text="Hello {{ name }}, your plan is {{ plan }}.",
                       html="<p>Hello {{ name }}</p>")


# -- versions ----------------------------------------------------------------------------
async def test_editing_adds_a_version_and_old_versions_stay_readable(tstore: Store) -> None:
    await welcome(tstore)
    v2 = await add_template(tstore, "welcome", subject="Hi {{ name }}", text="v2 {{ name }}")
    assert (v2.version, v2.latest_version) == (2, 2)
    v1 = await tstore.get_template("welcome", 1)
    assert v1 is not None and v1.subject == "Welcome, {{ name }}" and v1.latest_version == 2
    latest = await tstore.get_template("welcome")
    assert latest is not None and latest.version == 2 and latest.html is None
    assert await tstore.get_template("welcome", 3) is None
    assert await tstore.get_template("nope") is None
    await add_template(tstore, "alpha", subject="a", text="a")
    assert [(t.name, t.version) for t in await tstore.list_templates()] == [
        ("alpha", 1), ("welcome", 2)]


async def test_a_syntax_error_is_refused_when_the_version_is_added(tstore: Store) -> None:
    with pytest.raises(TemplateError, match="syntax error"):
        await add_template(tstore, "broken", subject="x", text="{% for %}")
    assert await tstore.get_template("broken") is None


# -- rendering at enqueue ----------------------------------------------------------------
async def test_enqueue_renders_the_current_version_once(tstore: Store, side: SideDB) -> None:
    await welcome(tstore)
    first = await enqueue_template(tstore, "welcome", {"name": "<Ada>", "plan": "pro"},
                                   key="welcome:1", to="ada@example.com")
    d = await tstore.get(first.id)
    assert d is not None
    assert (d.subject, d.text, d.html) == ("Welcome, <Ada>", "Hello <Ada>, your plan is pro.",
                                           "<p>Hello &lt;Ada&gt;</p>")
    assert (d.template_id, d.template_version) == ("welcome", 1)
    await add_template(tstore, "welcome", subject="New {{ name }}", text="new {{ name }}")
    again = await enqueue_template(tstore, "welcome", {"name": "Eve"}, key="welcome:1",
                                   to="ada@example.com")
    assert (again.id, again.created) == (first.id, False)  # same key: the original stays
    d = await tstore.get(first.id)
    assert d is not None and d.subject == "Welcome, <Ada>" and d.template_version == 1
    other = await enqueue_template(tstore, "welcome", {"name": "Bo"}, key="welcome:2",
                                   to="bo@example.com", lane="bulk")
    d2 = await tstore.get(other.id)
    assert d2 is not None and (d2.subject, d2.template_version, d2.lane) == ("New Bo", 2,
                                                                             "bulk")


async def test_a_missing_variable_is_refused_at_enqueue(tstore: Store, side: SideDB) -> None:
    await welcome(tstore)
    with pytest.raises(TemplateError, match="'plan' is undefined"):
        await enqueue_template(tstore, "welcome", {"name": "Ada"}, key="welcome:1",
                               to="ada@example.com")
    assert side.count("postlane_deliveries") == 0
    assert side.count("postlane_dead_letters") == 0


async def test_an_unknown_template_is_refused_at_enqueue(tstore: Store, side: SideDB) -> None:
    with pytest.raises(UnknownTemplate, match="'nope'"):
        await enqueue_template(tstore, "nope", {}, key="k", to="a@example.com")
    await welcome(tstore)
    with pytest.raises(UnknownTemplate, match="version 7"):
        await render_message(tstore, "welcome", {}, key="k", to="a@example.com", version=7)
    assert side.count("postlane_deliveries") == 0


async def test_a_deprecated_template_takes_no_new_enqueues(tstore: Store, side: SideDB) -> None:
    await welcome(tstore)
    variables = {"name": "Ada", "plan": "pro"}
    queued = await enqueue_template(tstore, "welcome", variables, key="welcome:1",
                                    to="ada@example.com")
    await deprecate_template(tstore, "welcome")
    with pytest.raises(TemplateDeprecated, match="deprecated"):
        await enqueue_template(tstore, "welcome", variables, key="welcome:2",
                               to="bo@example.com")
    # A message rendered before the deprecation cannot slip in through the store either.
    message = msg("welcome:3", template_id="welcome", template_version=1)
    with pytest.raises(TemplateDeprecated):
        await tstore.enqueue_many_if_template_usable("welcome", [message])
    assert side.count("postlane_deliveries") == 1
    d = await tstore.get(queued.id)
    assert d is not None and d.state is State.PENDING  # what was queued still sends
    await deprecate_template(tstore, "welcome", deprecated=False)
    await enqueue_template(tstore, "welcome", variables, key="welcome:2", to="bo@example.com")
    with pytest.raises(UnknownTemplate):
        await deprecate_template(tstore, "nope")


# -- deletion ----------------------------------------------------------------------------
async def test_delete_is_refused_while_deliveries_reference_the_template(
    tstore: Store, side: SideDB
) -> None:
    await welcome(tstore)
    variables = {"name": "Ada", "plan": "pro"}
    ids = [(await enqueue_template(tstore, "welcome", variables, key=f"welcome:{i}",
                                   to=f"u{i}@example.com")).id for i in range(4)]
    # One sent, one dead-lettered, two pending.
    claimed = await tstore.claim_batch("interactive", 2, "w", lease=timedelta(seconds=30))
    assert {d.id for d in claimed} == set(ids[:2])
    await tstore.set_state_if_sending_many("w", [
        Transition(ids[0], 1, State.SENT, "sent"),
        Transition(ids[1], 1, State.DEAD, "dead_lettered", dead_reason="permanent",
                   error="550 no such user"),
    ])
    assert await tstore.count_template_references("welcome") == 3
    with pytest.raises(TemplateInUse, match="referenced by 3 deliveries") as caught:
        await delete_template(tstore, "welcome")
    assert caught.value.references == 3
    assert await tstore.get_template("welcome") is not None
    # Once nothing may send or replay it any more, it can go.
    assert await tstore.cancel(ids[2]) and await tstore.cancel(ids[3])
    with pytest.raises(TemplateInUse, match="referenced by 1 delivery "):
        await delete_template(tstore, "welcome")
    assert await tstore.discard_dead_letter(ids[1], "user gone", "test")
    await delete_template(tstore, "welcome")
    assert await tstore.get_template("welcome") is None
    assert await tstore.list_templates() == []
    with pytest.raises(UnknownTemplate):
        await delete_template(tstore, "welcome")
    # The delivered rows keep their rendering; a re-created name never reuses a version.
    d = await tstore.get(ids[0])
    assert d is not None and d.text == "Hello Ada, your plan is pro." and d.template_version == 1
    again = await add_template(tstore, "welcome", subject="s", text="t")
    assert again.version == 2


# -- what retries and replays send -------------------------------------------------------
async def test_a_retry_sends_the_original_rendering_after_the_template_changed(
    tstore: Store, side: SideDB
) -> None:
    await welcome(tstore)
    user = {"name": "Ada", "plan": "pro"}
    result = await enqueue_template(tstore, "welcome", user, key="welcome:1",
                                    to="ada@example.com")
    provider = ContentProvider()
    provider.script_key("welcome:1", Outcome.transient("503 try later"))
    # The retry is scheduled an hour out (jitter pinned), so nothing races the edit below.
    config = fast_config(retry=RetryPolicy(base_s=3600, cap_s=3600))
    worker = Worker(tstore, provider, config=config, rand=lambda: 1.0)
    async with running(worker):
        d = await delivery_when(tstore, result.id, lambda d: d.attempts == 1
                                and d.state is State.PENDING, what="the failed first attempt")
        assert (d.run_at - side.now()).total_seconds() > 3000
        await add_template(tstore, "welcome", subject="CHANGED {{ name }}",
                           text="CHANGED {{ name }} {{ plan }}", html="<b>CHANGED</b>")
        user["name"], user["plan"] = "Eve", "free"  # the user record changed too
        side.make_due(result.id)
        d = await in_state(tstore, result.id, State.SENT)
    assert d.attempts == 2
    assert len(provider.contents) == 2
    original = ("welcome:1", "Welcome, Ada", "Hello Ada, your plan is pro.",
                "<p>Hello Ada</p>", 1)
    assert provider.contents == [original, original]


async def test_a_replay_sends_the_original_rendering_after_the_template_changed(
    tstore: Store, side: SideDB
) -> None:
    await welcome(tstore)
    result = await enqueue_template(tstore, "welcome", {"name": "Ada", "plan": "pro"},
                                    key="welcome:1", to="ada@example.com")
    provider = ContentProvider()
    provider.script_key("welcome:1", Outcome.permanent("550 mailbox unavailable"))
    async with running(Worker(tstore, provider, config=fast_config())):
        await in_state(tstore, result.id, State.DEAD)
        await add_template(tstore, "welcome", subject="CHANGED", text="CHANGED")
        await deprecate_template(tstore, "welcome")  # even deprecated: replay needs no render
        assert await tstore.replay_dead_letters([result.id], "test") == {result.id}
        await in_state(tstore, result.id, State.SENT)
    original = ("welcome:1", "Welcome, Ada", "Hello Ada, your plan is pro.",
                "<p>Hello Ada</p>", 1)
    assert provider.contents == [original, original]


# -- the outbox form ---------------------------------------------------------------------
async def test_in_transaction_enqueue_commits_or_rolls_back_with_the_caller(
    tstore: Store, side: SideDB
) -> None:
    await welcome(tstore)
    variables = {"name": "Ada", "plan": "pro"}
    url = store_url(tstore)
    if tstore.engine == "sqlite":
        conn = sqlite3.connect(url[len("sqlite:///"):], timeout=60)
        try:
            with conn:
                enqueue_template_in_transaction(conn, "welcome", variables, key="welcome:1",
                                                to="ada@example.com")
            conn.execute("BEGIN")
            enqueue_template_in_transaction(conn, "welcome", variables, key="welcome:2",
                                            to="bo@example.com")
            conn.rollback()
            with pytest.raises(TemplateError):
                render_message_in_transaction(conn, "welcome", {}, key="k",
                                              to="a@example.com")
        finally:
            conn.close()
    else:
        with psycopg.connect(url) as pg:
            enqueue_template_in_transaction(pg, "welcome", variables, key="welcome:1",
                                            to="ada@example.com")
        with psycopg.connect(url) as pg:
            enqueue_template_in_transaction(pg, "welcome", variables, key="welcome:2",
                                            to="bo@example.com")
            pg.rollback()
        async with await psycopg.AsyncConnection.connect(url) as apg:
            await enqueue_template_in_transaction_async(apg, "welcome", variables,
                                                        key="welcome:3", to="cy@example.com")
    keys = sorted(r[0] for r in side.query("SELECT idempotency_key FROM postlane_delivery_rows"))
    assert keys == (["welcome:1"] if tstore.engine == "sqlite" else ["welcome:1", "welcome:3"])
    d = await tstore.get("welcome:1")
    assert d is not None and (d.subject, d.template_version) == ("Welcome, Ada", 1)


async def test_postgres_delete_waits_for_an_open_enqueue_and_then_counts_it(
    pg_url: str,
) -> None:
    """The template row is share-locked from render to commit: a delete in between waits,
    then sees the new delivery and is refused. (SQLite serialises writers: no window.)"""
    async with open_store(pg_url) as store:
        await store.migrate()
        truncate_pg(pg_url)
        await welcome(store)
        with SideDB(pg_url) as side, psycopg.connect(pg_url) as pg:
            enqueue_template_in_transaction(pg, "welcome", {"name": "A", "plan": "p"},
                                            key="welcome:1", to="ada@example.com")
            deleting = asyncio.create_task(delete_template(store, "welcome"))
            await wait_until(lambda: side.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND position('postlane_templates' in query) > 0"),
                what="the delete to wait on the template's lock")
            assert not deleting.done()
            pg.commit()
            with pytest.raises(TemplateInUse, match="referenced by 1 delivery"):
                await deleting
