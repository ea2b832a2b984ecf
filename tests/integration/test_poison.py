"""A poison delivery never stalls its lane (design contract 13), on both engines.

Issue 19: one ``POST /v1/messages`` with ``expires_at`` ``9999-12-31T23:59:59-05:00`` was
stored (year 10000 in UTC), could not be read back ("timestamp too large" from psycopg,
"year 10000 is out of range" on SQLite), answered 500 to every later read, and the worker
re-claimed the batch holding it forever. Now such a time is refused at every enqueue path;
and a row that cannot be read all the same (written by hand or by an older Postlane) is
dead-lettered on its own, ``handler_error`` with the error verbatim, while the rest of its
batch is sent.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from conftest import SideDB, msg, sqlite_path, store_url
from hypothesis import given, settings
from hypothesis import strategies as st
from test_api import Api, api, body, problem  # noqa: F401  (the api fixture)
from test_provider_smtp import Handler, smtp_server
from typer.testing import CliRunner
from worker_helpers import Provider, all_terminal, fast_config, running, wait_until

import postlane
from postlane import DeadReason, InvalidTime, State
from postlane.cli.main import app as cli_app
from postlane.core.breaker import CONTROL_PREFIX, BreakerConfig, BreakerRecord
from postlane.core.message import UnreadableDelivery
from postlane.core.validation import EARLIEST_TIME, LATEST_TIME, check_time
from postlane.providers.smtp import SMTPProvider
from postlane.store import Store, open_store
from postlane.store.base import DeadLetterFilter
from postlane.templates import add_template, enqueue_template
from postlane.worker import Worker

ISSUE_EXPIRY = datetime.fromisoformat("9999-12-31T23:59:59-05:00")


async def nothing_stored(store: Store) -> bool:
    return (await store.stats()).states.get("pending", 0) == 0


# -- refused at enqueue ------------------------------------------------------------------
async def test_the_issues_expiry_is_refused_by_the_store(store: Store) -> None:
    with pytest.raises(InvalidTime, match="out of range") as info:
        await store.enqueue(msg("poison:1", expires_at=ISSUE_EXPIRY))
    assert info.value.field == "expires_at"
    with pytest.raises(InvalidTime):
        await store.enqueue_many([msg("good:1"), msg("poison:2", expires_at=ISSUE_EXPIRY)])
    for span in ("expires_in", "delay"):
        with pytest.raises(InvalidTime, match=span) as info:
            await store.enqueue(msg(f"poison:{span}", **{span: timedelta(days=9_000_000)}))
        assert info.value.field == span
    assert await nothing_stored(store)


async def test_the_issues_expiry_is_refused_by_the_outbox(store: Store) -> None:
    url = store_url(store)
    if store.engine == "sqlite":
        conn: Any = sqlite3.connect(sqlite_path(url))
    else:
        conn = psycopg.connect(url)
    try:
        with pytest.raises(InvalidTime):
            postlane.enqueue(conn, msg("poison:1", expires_at=ISSUE_EXPIRY))
        with pytest.raises(InvalidTime):
            postlane.enqueue_many(conn, [msg("good:1"), msg("poison:2", expires_at=ISSUE_EXPIRY)])
        conn.commit()
    finally:
        conn.close()
    if store.engine == "postgres":
        async with await psycopg.AsyncConnection.connect(url) as aconn:
            with pytest.raises(InvalidTime):
                await postlane.enqueue_async(aconn, msg("poison:3", expires_at=ISSUE_EXPIRY))
            with pytest.raises(InvalidTime):
                await postlane.enqueue_many_async(
                    aconn, [msg("poison:4", delay=timedelta(days=9_000_000))])
    assert await nothing_stored(store)


async def test_the_issues_expiry_is_refused_with_a_template(store: Store) -> None:
    await add_template(store, "reset", subject="Reset", text="Hi {{ name }}")
    with pytest.raises(InvalidTime) as info:
        await enqueue_template(store, "reset", {"name": "Ada"}, key="poison:1",
                               to="ada@example.com", expires_at=ISSUE_EXPIRY)
    assert info.value.field == "expires_at"
    assert await nothing_stored(store)


async def test_the_issues_post_is_answered_422_naming_the_field(api: Api) -> None:
    response = await api.send("poison:1", body(expires_at="9999-12-31T23:59:59-05:00"))
    data = problem(response, 422)
    assert data["field"] == "expires_at" and "out of range" in data["detail"]
    naive = await api.send("poison:2", body(expires_at="2030-01-01T12:00:00"))
    assert problem(naive, 422)["errors"][0]["location"] == "body.expires_at"
    assert await nothing_stored(api.store)


def test_the_cli_refuses_an_expiry_window_past_year_9999(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    runner = CliRunner()
    assert runner.invoke(cli_app, ["--db", url, "migrate"]).exit_code == 0
    for window in ("9000000d", "99999999999d"):
        result = runner.invoke(cli_app, ["--db", url, "enqueue", "--to", "a@example.com",
                                         "--key", "poison:1", "--text", "t",
                                         "--expires-in", window])
        assert result.exit_code != 0, result.output
        assert "expires" in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("when", [
    EARLIEST_TIME,
    EARLIEST_TIME.astimezone(timezone(timedelta(hours=-14))),
    LATEST_TIME - timedelta(microseconds=1),
    (LATEST_TIME - timedelta(microseconds=1)).astimezone(timezone(timedelta(hours=14))),
])
async def test_the_extreme_times_accepted_are_read_back_and_claimed(
        store: Store, when: datetime) -> None:
    """Every time accepted round-trips through both engines (SQLite keeps epoch seconds in a
    REAL: microseconds may round, the year may not)."""
    created = await store.enqueue(msg("edge:1", expires_at=when))
    got = await store.get(created.id)
    assert got is not None and not isinstance(got, UnreadableDelivery)
    assert got.expires_at is not None
    assert abs(got.expires_at - when) < timedelta(milliseconds=1)
    claimed = await store.claim_batch("interactive", 10, "w", timedelta(seconds=30))
    assert [type(d) for d in claimed] == [type(got)]


@pytest.mark.parametrize("when", [
    EARLIEST_TIME - timedelta(microseconds=1),
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),  # year 0 in UTC
    LATEST_TIME,
    ISSUE_EXPIRY,
    datetime.max.replace(tzinfo=UTC),
])
async def test_times_past_the_range_are_refused(store: Store, when: datetime) -> None:
    with pytest.raises(InvalidTime):
        await store.enqueue(msg("edge:1", expires_at=when))


# -- unreadable rows: dead letters of their own, the rest sent ----------------------------
def _poison_sql(engine: str) -> dict[str, tuple[str, str]]:
    """key -> (SET clause that breaks the row, the error its read gives, verbatim)."""
    if engine == "postgres":
        return {
            "poison:issue": ("expires_at = '10000-01-01T04:59:59Z'",
                             "timestamp too large (after year 10K): '10000-01-01 04:59:59+00'"),
            "poison:infinity": ("expires_at = 'infinity'",
                                "timestamp too large (after year 10K): 'infinity'"),
            "poison:bc": ("expires_at = '0001-12-31 23:00:00+00 BC'",
                          "timestamp too small (before year 1): '0001-12-31 23:00:00+00 BC'"),
            "poison:headers": ("""headers = '{"X-Count": 5}'""", "header 'X-Count' is not text"),
            "poison:metadata": ("metadata = '[1, 2]'", "metadata: ValueError: not a JSON "
                                                        "object: [1, 2]"),
        }
    return {
        "poison:issue": ("expires_at = 253402318799.0", "year 10000 is out of range"),
        "poison:text-time": ("expires_at = '10000-01-01T04:59:59Z'",
                             "expires_at: TypeError: "),
        "poison:headers": ("headers = '{\"X-Count\": '", "headers: JSONDecodeError: "),
        "poison:metadata": ("metadata = 'not json'", "metadata: JSONDecodeError: Expecting value"),
        # bytes another program wrote: sqlite3 fails the whole read on them
        "poison:utf8": ("subject = CAST(x'ff' AS TEXT)",
                        "subject: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in "
                        "position 0: invalid start byte"),
    }


def break_rows(side: SideDB, poison: dict[str, tuple[str, str]]) -> None:
    for key, (assignment, _) in poison.items():
        # The time is on the delivery's narrow row, the content on its message (0007).
        if assignment.startswith("expires_at"):
            side.query(f"UPDATE postlane_deliveries SET {assignment} WHERE id = "
                       "(SELECT id FROM postlane_messages WHERE idempotency_key = ?)", (key,))
        else:
            side.query(f"UPDATE postlane_messages SET {assignment} WHERE idempotency_key = ?",
                       (key,))


async def test_unreadable_rows_are_dead_letters_and_the_rest_of_the_batch_is_sent(
        store: Store, side: SideDB) -> None:
    poison = _poison_sql(store.engine)
    keys = []
    for number in range(3):  # good ones before, between and after the broken ones
        keys.append(f"good:{number}")
        keys.extend(list(poison)[number::3])
    keys.append("good:3")
    for key in keys:
        await store.enqueue(msg(key))
    break_rows(side, poison)

    found = {d.key: d for d in await store.find_deliveries(recipient="alice@example.com")}
    for key, (_, error) in poison.items():  # reads no longer fail: the row says why
        unreadable = found[key]
        assert isinstance(unreadable, UnreadableDelivery) and error in unreadable.unreadable
        assert await store.get(key) == unreadable

    provider = Provider()
    worker = Worker(store, provider, config=fast_config(batch_size=len(keys)))
    async with running(worker):
        states = await all_terminal(store)
    assert states == {"sent": 4, "dead": len(poison)}
    assert sorted(provider.keys()) == [f"good:{n}" for n in range(4)]  # never the poison
    for key, (_, error) in poison.items():
        d = await store.get(key)
        assert d is not None and d.state is State.DEAD
        assert d.dead_reason == DeadReason.HANDLER_ERROR and d.claims == 1  # no loop
        entry = await store.dead_letter(d.id)
        assert entry is not None and entry.reason == DeadReason.HANDLER_ERROR
        assert entry.last_response is not None and error in entry.last_response
        assert entry.last_response.startswith("the stored delivery cannot be read: ")
        assert entry.snapshot["idempotency_key"] == key
        assert [h["outcome"] for h in entry.attempt_history] == ["handler_error"]
    assert worker.counters["errors"] == 0
    listed = await store.list_dead_letters(DeadLetterFilter())
    assert sorted(e.snapshot["idempotency_key"] for e in listed) == sorted(poison)


async def test_a_row_whose_mime_message_cannot_be_built_is_a_dead_letter_of_its_own(
        store: Store, side: SideDB) -> None:
    """Through the SMTP adapter and a real server: the email library fails on this row's
    own header (an IndexError while folding it), the others are delivered."""
    for key in ("good:1", "poison:mime", "good:2"):
        await store.enqueue(msg(key, sender="shop@example.org"))
    side.query("UPDATE postlane_messages SET headers = ? WHERE idempotency_key = ?",
               ('{"Reply-To": "\\""}', "poison:mime"))
    handler = Handler()
    async with smtp_server(handler) as server:
        provider = SMTPProvider.from_url(f"smtp://127.0.0.1:{server.port}")
        async with running(Worker(store, provider, config=fast_config())):
            states = await all_terminal(store)
    assert states == {"sent": 2, "dead": 1}
    assert len(handler.received) == 2
    d = await store.get("poison:mime")
    assert d is not None and d.dead_reason == DeadReason.HANDLER_ERROR and d.claims == 1
    entry = await store.dead_letter(d.id)
    assert entry is not None and entry.reason == DeadReason.HANDLER_ERROR
    assert entry.last_response is not None
    assert "IndexError: list index out of range" in entry.last_response


async def test_reads_show_an_unreadable_row_instead_of_failing(api: Api, side: SideDB) -> None:
    """The API, the dashboard and the CLI read the issue's row (written by hand here, as an
    older Postlane stored it) without a 500, before and after it is dead-lettered."""
    store = api.store
    poison = {"poison:issue": _poison_sql(store.engine)["poison:issue"]}
    for key in ("good:1", "poison:issue"):
        await store.enqueue(msg(key))
    break_rows(side, poison)
    bad = await store.get("poison:issue")
    assert bad is not None
    read = api.auth("read")

    async def pages_answer() -> None:
        one = await api.client.get(f"/v1/messages/{bad.id}", headers=read)
        assert one.status_code == 200, one.text
        assert one.json()["message"]["key"] == "poison:issue"
        found = await api.client.get("/v1/messages?recipient=alice@example.com", headers=read)
        assert found.status_code == 200 and len(found.json()["messages"]) == 2
        assert (await api.client.get("/v1/status", headers=read)).status_code == 200
        signed_in = await api.client.post("/dashboard/login", data={
            "api_key": api.tokens["read"], "next": "/dashboard"})
        assert signed_in.status_code in (302, 303), signed_in.text
        for page in (f"/dashboard/messages/{bad.id}", "/dashboard/messages?q=alice@example.com",
                     "/dashboard/dead-letters", "/dashboard"):
            response = await api.client.get(page, follow_redirects=True)
            assert response.status_code == 200, (page, response.text[-2000:])
        for command in (["status"], ["dlq", "list"], ["timeline", str(bad.id)]):
            result = await asyncio.to_thread(  # the CLI runs its own event loop
                CliRunner().invoke, cli_app, ["--db", api.url, *command])
            assert result.exit_code == 0, (command, result.output)

    await pages_answer()
    async with running(Worker(store, Provider(), config=fast_config())):
        await all_terminal(store)
    await pages_answer()
    entries = await api.client.get("/v1/dead-letters", headers=read)
    assert entries.status_code == 200
    assert entries.json()["by_reason"] == {"handler_error": 1}
    entry = await api.client.get(f"/v1/dead-letters/{bad.id}", headers=read)
    assert entry.status_code == 200 and poison["poison:issue"][1] in entry.json()["last_response"]
    # A replay is the operator's call: it is not refused for the unreadable expiry, and the
    # worker dead-letters the row again, on its own, without sending it.
    replayed = await api.client.post(f"/v1/dead-letters/{bad.id}/replay",
                                     headers=api.auth("operate"))
    assert replayed.status_code == 200, replayed.text
    provider = Provider()
    async with running(Worker(store, provider, config=fast_config())):
        await all_terminal(store)
    again = await store.get(bad.id)
    assert again is not None and again.state is State.DEAD and again.claims == 2
    assert provider.requests == []


_ZONES = st.builds(lambda minutes: timezone(timedelta(minutes=minutes)),
                   st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59))


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_every_time_accepted_reads_back_on_the_engine(engine: str, request: Any) -> None:
    """Property: a time ``check_time`` accepts, enqueued through the outbox, is read back
    (psycopg's loader on PostgreSQL; epoch seconds through the SQLite store's reader) as the
    same instant, to the millisecond; one it refuses is refused by ``enqueue``."""
    url = request.getfixturevalue("sqlite_url" if engine == "sqlite" else "pg_url")

    async def migrate() -> None:
        async with open_store(url) as store:
            await store.migrate()

    asyncio.run(migrate())
    conn: Any = (sqlite3.connect(sqlite_path(url)) if engine == "sqlite"
                 else psycopg.connect(url))

    @settings(max_examples=300, deadline=None)
    @given(when=st.datetimes(min_value=datetime.min, max_value=datetime.max, timezones=_ZONES))
    def check(when: datetime) -> None:
        try:
            check_time(when, field="expires_at")
        except InvalidTime:
            with pytest.raises(InvalidTime):
                postlane.enqueue(conn, msg("prop:read-back:1", expires_at=when))
            return
        created = postlane.enqueue(conn, msg("prop:read-back:1", expires_at=when))
        placeholder = "?" if engine == "sqlite" else "%s"
        (stored,) = conn.execute(f"SELECT expires_at FROM postlane_deliveries "
                                 f"WHERE id = {placeholder}", (created.id,)).fetchone()
        back = datetime.fromtimestamp(stored, UTC) if engine == "sqlite" else stored
        assert abs(back - when) < timedelta(milliseconds=1)
        conn.rollback()

    try:
        check()
    finally:
        conn.close()


async def test_a_probe_that_meets_only_a_poison_row_probes_again(
        store: Store, side: SideDB) -> None:
    """The breaker is open and due for its probe; the probe (one delivery here) is the
    unreadable row at the head of the lane. Dead-lettered unsent, it says nothing about the
    provider: the worker probes again with the next row instead of waiting forever for an
    outcome that never comes (with one worker, nobody else would abandon the probe)."""
    keys = ("poison:issue", "good:1", "good:2")
    ids = [(await store.enqueue(msg(key, delay=timedelta(hours=1)))).id for key in keys]
    break_rows(side, {"poison:issue": _poison_sql(store.engine)["poison:issue"]})
    provider = Provider()
    await store.set_control(CONTROL_PREFIX + provider.account, BreakerRecord(
        "open", time.time() - 1, 5.0, None, "an outage").as_json())
    config = fast_config(breaker=BreakerConfig(min_failures=10_000, probes=1))
    worker = Worker(store, provider, config=config)
    async with running(worker):
        await wait_until(lambda: worker.breaker.state == "half_open", what="the probe")
        for id_ in ids:  # due in this order: the poison row is the probe
            side.make_due(id_)
        states = await all_terminal(store)
    assert states == {"sent": 2, "dead": 1}
    assert sorted(provider.keys()) == ["good:1", "good:2"]
    assert CONTROL_PREFIX + provider.account not in await store.get_controls()  # closed
