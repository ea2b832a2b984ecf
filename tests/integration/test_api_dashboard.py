"""The dashboard's sessions and forms without a browser (the browser test is in
``tests/acceptance``): the cookie holds no key, forms need their CSRF token and the
``operate`` scope, a revoked key ends its sessions, redirects stay inside the dashboard."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from postlane import open_store
from postlane.api import create_app
from postlane.api.keys import create_key
from postlane.api.sessions import COOKIE, Sessions
from postlane.store import Store
from postlane.worker.controls import LANE_PAUSE


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[Store]:
    async with open_store(sqlite_url) as s:
        await s.migrate()
        yield s


@pytest.fixture
async def client(store: Store, sqlite_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(sqlite_url, sample_interval_s=0)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
            yield c


async def login(client: httpx.AsyncClient, token: str) -> httpx.Response:
    return await client.post("/dashboard/login", data={"api_key": token,
                                                       "next": "/dashboard/dead-letters"})


def csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match, "no CSRF token in the page"
    return match[1]


async def test_sign_in_keeps_no_key_in_the_cookie(client: httpx.AsyncClient,
                                                  store: Store) -> None:
    _, token = await create_key(store, "read,operate", name="ops")
    response = await login(client, token)
    assert response.status_code == 303
    assert response.headers["location"] == "/dashboard/dead-letters"
    cookie = response.cookies[COOKIE]
    assert token not in cookie and token[3:] not in cookie
    header = response.headers["set-cookie"].lower()
    assert "httponly" in header and "samesite=strict" in header and "path=/dashboard" in header
    page = await client.get("/dashboard")
    assert page.status_code == 200 and "Lanes" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]


async def test_sign_in_refusals(client: httpx.AsyncClient, store: Store) -> None:
    _, sender = await create_key(store, "send", name="app")
    refused = await login(client, sender)
    assert refused.status_code == 401 and "lacks the &#39;read&#39; scope" in refused.text
    refused = await login(client, "pl_nope")
    assert refused.status_code == 401 and "unknown or revoked" in refused.text
    # Only redirects inside the dashboard.
    _, token = await create_key(store, "read", name="ops")
    response = await client.post("/dashboard/login", data={"api_key": token,
                                                           "next": "https://evil.example"})
    assert response.headers["location"] == "/dashboard"
    forged = Sessions().issue(1)  # signed with another secret
    client.cookies.clear()
    client.cookies.set(COOKIE, forged)
    assert (await client.get("/dashboard")).status_code == 303


async def test_forms_need_their_csrf_token_and_the_operate_scope(
        client: httpx.AsyncClient, store: Store) -> None:
    _, token = await create_key(store, "read,operate", name="ops")
    await login(client, token)
    token_in_page = csrf((await client.get("/dashboard")).text)
    forged = await client.post("/dashboard/lanes/bulk/pause", data={"csrf": "0" * 32})
    assert forged.status_code == 303
    assert "the form expired" in (await client.get("/dashboard")).text
    assert LANE_PAUSE + "bulk" not in await store.get_controls()
    paused = await client.post("/dashboard/lanes/bulk/pause", data={"csrf": token_in_page})
    assert paused.status_code == 303
    assert LANE_PAUSE + "bulk" in await store.get_controls()

    client.cookies.clear()
    _, reader = await create_key(store, "read", name="auditor")
    await login(client, reader)
    page = (await client.get("/dashboard")).text
    assert "Resume bulk" not in page
    refused = await client.post("/dashboard/lanes/bulk/resume", data={"csrf": csrf(page)})
    assert refused.status_code == 303
    assert "lacks the &#39;operate&#39; scope" in (await client.get("/dashboard")).text
    assert LANE_PAUSE + "bulk" in await store.get_controls()


async def test_revoking_a_key_ends_its_sessions(client: httpx.AsyncClient,
                                                store: Store) -> None:
    key, token = await create_key(store, "read", name="leaving")
    await login(client, token)
    assert (await client.get("/dashboard")).status_code == 200
    await store.revoke_api_key(key.id)
    response = await client.get("/dashboard/messages?q=1")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/dashboard/login?next=")


async def test_signing_out_ends_the_session_on_the_server(client: httpx.AsyncClient,
                                                          store: Store) -> None:
    key, token = await create_key(store, "read", name="ops")
    await login(client, token)
    page = await client.get("/dashboard")
    assert page.status_code == 200
    copied = client.cookies[COOKIE]  # a copy of the cookie taken before signing out
    # Without its CSRF token, a sign-out form (posted from elsewhere) signs nobody out.
    forged = await client.post("/dashboard/logout", data={"csrf": "0" * 32})
    assert forged.status_code == 303 and forged.headers["location"] == "/dashboard"
    assert (await client.get("/dashboard")).status_code == 200
    signed_out = await client.post("/dashboard/logout", data={"csrf": csrf(page.text)})
    assert signed_out.status_code == 303
    assert signed_out.headers["location"] == "/dashboard/login"
    stored = await store.get_api_key(key_id=key.id)
    assert stored is not None and stored.sessions_after is not None
    # The copied cookie is refused although its signature and expiry are still good.
    client.cookies.clear()
    client.cookies.set(COOKIE, copied)
    replayed = await client.get("/dashboard")
    assert replayed.status_code == 303
    assert replayed.headers["location"].startswith("/dashboard/login")
    # Signing in again opens a new session.
    client.cookies.clear()
    await login(client, token)
    assert (await client.get("/dashboard")).status_code == 200


def test_a_session_issued_before_its_keys_sign_out_is_refused() -> None:
    sessions = Sessions(b"k" * 32)
    cookie = sessions.read(sessions.issue(7, now=1000.0), now=1001.0)
    assert cookie is not None and (cookie.key_id, cookie.issued_at) == (7, 1000.0)
    assert not sessions.signed_out(cookie, None)
    assert sessions.signed_out(cookie, 1000.5)
    assert not sessions.signed_out(cookie, 999.0)
    assert sessions.read(sessions.issue(7, now=1000.0), now=1000.0 + 9 * 3600) is None


def test_apikey_cli_shows_the_token_once_and_revokes(sqlite_url: str) -> None:
    from typer.testing import CliRunner

    from postlane.cli.main import app

    runner = CliRunner()

    def cli(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["--db", sqlite_url, *args])
        return result.exit_code, result.output

    assert cli("migrate")[0] == 0
    code, out = cli("apikey", "create", "--scopes", "send,read", "--name", "shop", "--json")
    assert code == 0, out
    created = json.loads(out)
    assert created["token"].startswith("pl_") and created["scopes"] == ["send", "read"]
    code, out = cli("apikey", "list", "--json")
    listed = json.loads(out)
    assert [(k["id"], k["name"], k["revoked_at"]) for k in listed] == [(1, "shop", None)]
    assert created["token"] not in out and listed[0]["prefix"] == created["token"][:11]
    code, out = cli("apikey", "create", "--scopes", "admin")
    assert code != 0 and "unknown scope(s) admin" in out
    assert cli("apikey", "revoke", "1") == (0, "revoked API key 1\n")
    code, out = cli("apikey", "revoke", "1")
    assert code == 1 and "no active API key with id 1" in out


async def test_the_message_preview_lists_parts_and_operators_download_them(
        client: httpx.AsyncClient, store: Store) -> None:
    from postlane import Message
    from postlane.core.attachments import Attachment

    pdf = b"%PDF-1.4\n\x00\xff" * 100
    result = await store.enqueue(Message(
        key="receipt:1", to="ada@example.com", text="Your receipt",
        attachments=(Attachment("reçu <1>.pdf", pdf, "application/pdf"),)))
    _, reader = await create_key(store, "read", name="auditor")
    await login(client, reader)
    page = (await client.get(f"/dashboard/messages/{result.id}")).text
    assert "reçu &lt;1&gt;.pdf" in page and "application/pdf" in page and "1,100 bytes" in page
    assert "/attachments/0" not in page  # no download link without operate
    refused = await client.get(f"/dashboard/messages/{result.id}/attachments/0")
    assert refused.status_code == 403

    client.cookies.clear()
    _, ops = await create_key(store, "read,operate", name="ops")
    await login(client, ops)
    page = (await client.get(f"/dashboard/messages/{result.id}")).text
    assert f"/dashboard/messages/{result.id}/attachments/0" in page
    download = await client.get(f"/dashboard/messages/{result.id}/attachments/0")
    assert download.status_code == 200 and download.content == pdf
    assert download.headers["content-disposition"].startswith("attachment;")
    assert download.headers["x-content-type-options"] == "nosniff"
    missing = await client.get(f"/dashboard/messages/{result.id}/attachments/1")
    assert missing.status_code == 404
