"""docs/frameworks.md's examples run as written (only the database URL is replaced), each on a
fresh PostgreSQL database with Postlane's tables and a ``users`` table: Django (in a
subprocess: its settings are global), FastAPI, Flask, psycopg2, asyncpg, and the pytest
plugin (through pytester)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from postlane.store import open_store

pytest_plugins = ["pytester"]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"
DOC_URL = "postgresql://localhost/app"


def example(name: str, replacements: dict[str, str] | None = None) -> str:
    """The code block right after ``<!-- example: NAME -->``, with ``replacements``."""
    match = re.search(rf"<!-- example: {re.escape(name)} -->\s*\n```[a-z]*\n(.*?)\n```",
                      PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert match, f"no example {name!r} in docs/frameworks.md"
    source = match.group(1)
    for old, new in (replacements or {}).items():
        assert old in source, f"example {name!r} no longer contains {old!r}"
        source = source.replace(old, new)
    return source


def run(name: str, replacements: dict[str, str]) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"frameworks_{name}"}
    exec(compile(example(name, replacements), f"frameworks.md:{name}", "exec",
                 dont_inherit=True), namespace)
    return namespace


@pytest.fixture
async def app_db(fresh_pg_url: str) -> str:
    """A fresh database with Postlane's tables and the examples' ``users`` table."""
    async with open_store(fresh_pg_url) as store:
        await store.migrate()
    with psycopg.connect(fresh_pg_url) as conn:
        conn.execute("CREATE TABLE users (id SERIAL PRIMARY KEY, email TEXT NOT NULL)")
    return fresh_pg_url


async def welcomed(url: str) -> list[tuple[str, str]]:
    """(key, recipient) of every delivery, and check each has its user."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT idempotency_key, recipient FROM postlane_delivery_rows "
                            "ORDER BY id").fetchall()
        users = conn.execute("SELECT id, email FROM users ORDER BY id").fetchall()
    assert [(f"welcome:{i}", e) for i, e in users] == rows
    return rows


async def test_psycopg2(app_db: str) -> None:
    run("psycopg2", {DOC_URL: app_db})
    assert await welcomed(app_db) == [("welcome:1", "ada@example.com")]


async def test_asyncpg(app_db: str) -> None:
    # The example runs its own event loop: run it in a thread of its own.
    import asyncio

    await asyncio.to_thread(run, "asyncpg", {DOC_URL: app_db})
    assert await welcomed(app_db) == [("welcome:1", "grace@example.com")]


async def test_fastapi(app_db: str) -> None:
    url = app_db.replace("postgresql://", "postgresql+asyncpg://", 1)
    ns = run("fastapi", {"postgresql+asyncpg://localhost/app": url})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ns["app"]),
                                 base_url="http://app") as client:
        response = await client.post("/users", params={"email": "ada@example.com"})
    assert response.status_code == 200, response.text
    await ns["engine"].dispose()
    assert await welcomed(app_db) == [("welcome:1", "ada@example.com")]


async def test_flask(app_db: str) -> None:
    url = app_db.replace("postgresql://", "postgresql+psycopg2://", 1)
    ns = run("flask", {"postgresql+psycopg2://localhost/app": url})
    response = ns["app"].test_client().post("/users", data={"email": "ada@example.com"})
    assert response.status_code == 200
    with ns["app"].app_context():
        ns["db"].engine.dispose()
    assert await welcomed(app_db) == [("welcome:1", "ada@example.com")]


DJANGO = """
import json, sys
from urllib.parse import urlsplit

import django
from django.conf import settings

url = urlsplit(sys.argv[1])
conf = {}
exec(sys.argv[2], conf)
conf = {k: v for k, v in conf.items() if k.isupper()}
settings.configure(DATABASES={"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": url.path.lstrip("/"),
    "USER": url.username, "HOST": url.hostname, "PORT": url.port}}, **conf)
django.setup()
from django.db import connection


class User:
    '''Stands in for the application's model: a row in ``users``.'''
    class objects:
        @staticmethod
        def create(email):
            user = User()
            with connection.cursor() as cur:
                cur.execute("INSERT INTO users (email) VALUES (%s) RETURNING id", [email])
                user.pk = cur.fetchone()[0]
            return user


view = {"User": User}
exec(sys.argv[3], view)
view["sign_up"]("ada@example.com")
try:  # no key: refused (REQUIRE_KEY), and nothing written
    from django.core.mail import send_mail
    send_mail("Hi", "no key", None, ["bo@example.com"])
except Exception as exc:
    print(json.dumps({"refused": type(exc).__name__}))
"""


async def test_django(app_db: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DJANGO, app_db, example("django-settings"),
         example("django-view")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"refused": "InvalidKey"}
    assert await welcomed(app_db) == [("welcome:1", "ada@example.com")]
    async with open_store(app_db) as store:
        d = await store.get("welcome:1")
    assert d is not None
    assert (d.sender, d.html, d.lane) == (
        "shop@example.com", "<p>Hello, your account is ready.</p>", "interactive")


def test_pytest_plugin(pytester: pytest.Pytester, app_db: str) -> None:
    test_url = "postgresql://localhost/app_test"
    pytester.makeconftest(example("pytest-conftest", {test_url: app_db}))
    pytester.makepyfile(test_app=example("pytest-test", {test_url: app_db}))
    pytester.makeini("[pytest]\nfilterwarnings = error\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
