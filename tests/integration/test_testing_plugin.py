"""The ``postlane.testing`` pytest plugin, as an application's test suite uses it: run with
pytester in a subprocess (the plugin's ``drain`` starts an event loop of its own), on SQLite
and on PostgreSQL."""

from __future__ import annotations

import pytest
from test_outbox import any_store, pg_store, sqlite_store

from postlane.store import Store

pytest_plugins = ["pytester"]
assert pg_store and sqlite_store and any_store  # fixtures, imported for this module's tests

CONFTEST = """
import pytest

pytest_plugins = ["postlane.testing"]
URL = {url!r}


@pytest.fixture
def postlane_url():
    return URL


def connect():
    if URL.startswith("sqlite"):
        import sqlite3
        return sqlite3.connect(URL[len("sqlite:///"):])
    import psycopg
    return psycopg.connect(URL)
"""

TESTS = '''
import postlane
from postlane import Message
from conftest import connect


def signup(user_id, commit, lane="interactive"):
    """The application code under test: a business event and its email."""
    conn = connect()
    postlane.enqueue(conn, Message(key=f"welcome:{user_id}", to=f"u{user_id}@example.com",
                                   subject="Welcome", text="Hello", lane=lane))
    conn.commit() if commit else conn.rollback()
    conn.close()


def test_what_was_committed(postlane_outbox):
    signup(1, commit=True, lane="bulk")
    signup(2, commit=False)
    found = postlane_outbox.assert_enqueued(to="u1@example.com", lane="bulk")
    assert (found.key, found.state) == ("welcome:1", "pending")
    assert [e.key for e in postlane_outbox.all()] == ["welcome:1"]
    sent = postlane_outbox.drain()
    assert [(d.key, d.recipient) for d in sent] == [("welcome:1", "u1@example.com")]
    assert postlane_outbox.assert_enqueued(key="welcome:1").state == "sent"


def test_sees_only_this_tests_deliveries(postlane_outbox):
    postlane_outbox.assert_nothing_enqueued()


def test_in_the_same_transaction(postlane_outbox):
    conn = connect()
    postlane.enqueue(conn, Message(key="welcome:3", to="u3@example.com", text="Hi"))
    postlane_outbox.assert_nothing_enqueued()  # not committed: invisible to others
    assert postlane_outbox.assert_enqueued(key="welcome:3", conn=conn).to == "u3@example.com"
    conn.rollback()
    conn.close()


def test_a_failing_assertion_says_what_there_is(postlane_outbox):
    signup(4, commit=True)
    postlane_outbox.assert_enqueued(to="someone-else@example.com")
'''


async def test_plugin(pytester: pytest.Pytester, any_store: Store) -> None:
    url = (any_store.url if any_store.engine == "postgres"  # type: ignore[attr-defined]
           else f"sqlite:///{any_store.path}")  # type: ignore[attr-defined]
    pytester.makeconftest(CONFTEST.format(url=url))
    pytester.makepyfile(test_app=TESTS)
    pytester.makeini("[pytest]\nfilterwarnings = error\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "*expected one delivery matching {'to': 'someone-else@example.com'}, found 0;*",
        "*Enqueued(id=*, key='welcome:4', to='u4@example.com', lane='interactive'*",
    ])


def test_without_a_database_the_fixture_says_what_to_do(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["postlane.testing"]\n')
    pytester.makepyfile(test_app="def test_it(postlane_outbox):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*set POSTLANE_DATABASE_URL*override the `postlane_url`*"])
    assert result.ret != 0
