"""What can never be sent is refused at the door, with a 4xx problem, and nothing is stored.

Through the real HTTP API on both engines (and the dashboard, the CSV upload and the
webhooks it serves): line breaks of every kind in a subject or a header, headers Postlane
sets or a field owns, metadata nested past the limit, NUL and lone surrogates, templates
whose subject could never be a header. Each was a 201 that died at send time, or a 500.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SideDB
from typer.testing import CliRunner

from postlane import open_store
from postlane.cli.main import app as cli_app
from postlane.core.validation import MAX_METADATA_DEPTH
from postlane.errors import InvalidHeader, InvalidText, TemplateError
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.templates import add_template, enqueue_template
from postlane.webhooks import WebhookMalformed, receive, sign_standard
from tests.integration.test_api import Api, api, body, problem  # noqa: F401  (the fixture)
from tests.integration.test_api_webhooks import SECRET, secret  # noqa: F401  (the fixture)
from tests.integration.test_dead_letters import kill_all
from tests.integration.test_webhooks_sns import config, sns_body, stand_in

BREAKS = ["\r", "\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


async def nothing_stored(api: Api, key: str) -> None:
    assert await api.store.find_deliveries(key=key) == []


# -- POST /v1/messages -------------------------------------------------------------------
@pytest.mark.parametrize("brk", BREAKS)
async def test_a_line_break_of_any_kind_in_subject_or_header_is_422(api: Api, brk: str) -> None:
    data = problem(await api.send("door:s", body(subject=f"Hi{brk}Bcc: x@example.com")), 422)
    assert data["type"].endswith("invalid-message") and data["field"] == "subject"
    assert "line break" in data["detail"]
    data = problem(await api.send("door:h", body(
        headers={"Reply-To": f'"Ada{brk}Bcc: x@example.com" <ada@example.com>'})), 422)
    assert data["field"] == "headers" and "line break" in data["detail"]
    await nothing_stored(api, "door:s")
    await nothing_stored(api, "door:h")


@pytest.mark.parametrize(("name", "why"), [
    ("Message-ID", "set by Postlane"), ("content-type", "set by Postlane"),
    ("MIME-Version", "set by Postlane"), ("Content-Transfer-Encoding", "set by Postlane"),
    ("X-Postlane-Key", "set by Postlane"), ("x-postlane-trace", "set by Postlane"),
    ("To", "'to' field"), ("Cc", "'to' field"), ("BCC", "'to' field"),
    ("From", "'sender' field"), ("Sender", "'sender' field"), ("Subject", "'subject' field"),
])
async def test_headers_postlane_sets_or_a_field_owns_are_422(api: Api, name: str,
                                                             why: str) -> None:
    data = problem(await api.send("door:r", body(headers={name: "victim@example.com"})), 422)
    assert data["field"] == "headers" and why in data["detail"]
    await nothing_stored(api, "door:r")


async def test_metadata_past_the_depth_limit_is_422_before_hashing(api: Api) -> None:
    ok = await api.send("door:m0", body(metadata=nested(MAX_METADATA_DEPTH)))
    assert ok.status_code == 201, ok.text
    for depth in (MAX_METADATA_DEPTH + 1, 300):
        data = problem(await api.send(f"door:m{depth}", body(metadata=nested(depth))), 422)
        assert f"deeper than {MAX_METADATA_DEPTH} levels" in data["detail"]
        assert data["errors"][0]["location"] == "body.metadata"
        await nothing_stored(api, f"door:m{depth}")


async def test_a_body_too_deep_for_the_json_parser_is_a_4xx(api: Api) -> None:
    deep = '{"to": "ada@example.com", "text": "t", "metadata": ' + '{"a": ' * 100_000 + "1" \
        + "}" * 100_000 + "}"
    response = await api.client.post(
        "/v1/messages", content=deep,
        headers={**api.auth("send"), "Idempotency-Key": "door:deep",
                 "Content-Type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    await nothing_stored(api, "door:deep")


@pytest.mark.parametrize(("field", "raw", "why"), [
    ("text", '"a\\u0000b"', "NUL"), ("subject", '"\\ud800"', "unicode"),
    ("metadata", '{"a": "\\u0000"}', "NUL"), ("metadata", '{"a": ["\\udfff"]}', "surrogate"),
    ("headers", '{"X-A": "\\ud83d"}', "unicode"), ("import_id", '"i\\u0000"', "NUL"),
])
async def test_nul_and_lone_surrogates_are_422(api: Api, field: str, raw: str, why: str) -> None:
    fields = {"to": '"ada@example.com"', "text": '"t"', field: raw}
    content = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    response = await api.client.post(
        "/v1/messages", content=content,
        headers={**api.auth("send"), "Idempotency-Key": "door:t",
                 "Content-Type": "application/json"})
    data = problem(response, 422)
    assert why.lower() in data["detail"].lower(), data
    await nothing_stored(api, "door:t")


async def test_encoded_word_syntax_is_422(api: Api) -> None:
    data = problem(await api.send("door:e", body(subject="=?utf-8?q?Hi?=")), 422)
    assert data["field"] == "subject" and "encoded-word" in data["detail"]
    data = problem(await api.send("door:=?utf-8?b?eA==?=", body()), 422)
    assert data["field"] == "key" and "encoded-word" in data["detail"]
    await nothing_stored(api, "door:e")


# -- templates ---------------------------------------------------------------------------
@pytest.mark.parametrize("brk", ["\n", "\u2028", "\x0b"])
async def test_a_template_subject_with_a_line_break_is_refused_at_creation(api: Api,
                                                                           brk: str) -> None:
    response = await api.client.post(
        "/v1/templates/welcome", headers=api.auth("operate"),
        json={"subject": f"Welcome{brk}{{{{ name }}}}", "text": "Hello"})
    data = problem(response, 422)
    assert data["field"] == "subject" and "line break" in data["detail"]
    assert await api.store.get_template("welcome") is None
    with pytest.raises(TemplateError, match="line break"):
        await add_template(api.store, "welcome", subject=f"A{brk}B", text="Hello")
    with pytest.raises(InvalidText, match="NUL"):
        await add_template(api.store, "welcome", subject="A", text="Hel\0lo")
    assert await api.store.get_template("welcome") is None


async def test_a_rendered_subject_with_a_line_break_is_refused_at_enqueue(api: Api) -> None:
    await add_template(api.store, "welcome", subject="Hi {{ name }}", text="Hello")
    with pytest.raises(InvalidHeader, match="line break"):
        await enqueue_template(api.store, "welcome", {"name": "Ada\u2028Bcc: x@y.z"},
                               key="welcome:1", to="ada@example.com")
    await nothing_stored(api, "welcome:1")
    rows = "user_id,email,name\n1,a@example.com,Ada\n2,b@example.com,\"B\x85ob\"\n"
    run = (await upload(api, "imp", rows)).json()
    assert (run["rows_created"], run["rows_skipped"]) == (1, 1)
    assert "line break" in run["problems"][0]["reason"]


def test_the_cli_refuses_a_template_subject_with_a_line_break(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    async def prepare() -> None:
        async with open_store(url) as store:
            await store.migrate()

    async def stored() -> object:
        async with open_store(url) as store:
            return await store.get_template("welcome")

    asyncio.run(prepare())
    result = CliRunner().invoke(cli_app, ["--db", url, "templates", "add", "welcome",
                                          "--subject", "Hi\nthere", "--text", "Hello"])
    assert result.exit_code == 1, result.output
    assert "line break" in result.output
    assert asyncio.run(stored()) is None


# -- CSV upload --------------------------------------------------------------------------
async def upload(api: Api, import_id: str, content: str | bytes,
                 **params: str) -> httpx.Response:
    data = content.encode() if isinstance(content, str) else content
    return await api.client.post(
        f"/v1/imports/{import_id}", headers=api.auth("operate"),
        params={"template": "welcome", **params},
        files={"file": ("users.csv", data, "text/csv")})


@pytest.mark.parametrize("where", ["name", "user_id", "email", "late"])
async def test_a_nul_byte_in_a_csv_is_422_and_nothing_is_imported(
        api: Api, side: SideDB, where: str) -> None:
    await add_template(api.store, "welcome", subject="Hi {{ name }}", text="Hello {{ name }}")
    rows = [f"{i},u{i}@example.com,User {i}" for i in range(2500)]
    bad = {"name": "7,u7@example.com,Us\0er", "user_id": "7\0,u7@example.com,User",
           "email": "7,u7@exa\0mple.com,User", "late": "2499,u@example.com,\0"}[where]
    rows.insert(7 if where != "late" else 2499, bad)
    data = problem(await upload(api, "nul", "user_id,email,name\n" + "\n".join(rows)), 422)
    assert data["type"].endswith("import-rejected")
    assert "NUL byte" in data["detail"]
    assert f"line {9 if where != 'late' else 2501}" in data["detail"]
    assert side.count("postlane_deliveries") == 0
    assert await api.store.get_import("nul") is None


# -- webhooks ----------------------------------------------------------------------------
def signed(body: bytes, event_id: str = "evt-door") -> dict[str, str]:
    now = int(time.time())
    return {"webhook-id": event_id, "webhook-timestamp": str(now),
            "webhook-signature": sign_standard(SECRET, event_id, now, body),
            "content-type": "application/json"}


@pytest.mark.parametrize(("payload", "why"), [
    (b'{"type": "email.delivered", "data": {"message_id": "m\\u0000", "to": "a@b.c"}}', "NUL"),
    (b'{"type": "email.bounced", "data": {"message_id": "m", "to": "\\ud800@b.c"}}',
     "lone surrogate"),
    (b'{"type": "email.delivered", "data": {"x": ' + b'[' * 100 + b']' * 100 + b'}}',
     "deeper than 32"),
    (b'{"type": "email.delivered", "data": ' + b'[' * 100_000 + b']' * 100_000 + b'}',
     "nested too deep"),
    (b'"just a string"', "not a JSON object"),
    (b"\xff\xfe not json", "not JSON"),
])
async def test_a_signed_webhook_that_cannot_be_stored_is_400(
        api: Api, side: SideDB, payload: bytes, why: str) -> None:
    response = await api.client.post("/v1/webhooks/sandbox", content=payload,
                                      headers=signed(payload))
    data = problem(response, 400)
    assert data["type"].endswith("webhook-malformed") and why in data["detail"], data
    assert side.count("postlane_provider_events") == 0
    # The event id was not used up: the genuine event with that id is still recorded.
    good = json.dumps({"type": "email.delivered",
                       "data": {"message_id": "m", "to": "a@b.c"}}).encode()
    again = await api.client.post("/v1/webhooks/sandbox", content=good, headers=signed(good))
    assert again.status_code == 200, again.text
    assert again.json()["events"][0]["duplicate"] is False


# -- dashboard ---------------------------------------------------------------------------
async def signed_in(api: Api) -> str:
    """Sign the client in to the dashboard; returns a CSRF token."""
    response = await api.client.post("/dashboard/login",
                                     data={"api_key": api.tokens["all"], "next": "/dashboard"})
    assert response.status_code == 303
    page = (await api.client.get("/dashboard")).text
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match
    return match[1]


async def test_dashboard_search_and_filters_with_a_nul_are_400(api: Api) -> None:
    await signed_in(api)
    found = await api.client.get("/dashboard/messages", params={"q": "ada\0@example.com"})
    assert found.status_code == 400 and "search contains a NUL character" in found.text
    for name in ("reason", "lane", "template_id", "import_id"):
        page = await api.client.get("/dashboard/dead-letters", params={name: "x\0"})
        assert page.status_code == 400 and "contains a NUL character" in page.text, name


async def test_dashboard_forms_with_a_nul_are_400_and_change_nothing(api: Api) -> None:
    token = await signed_in(api)
    [dead] = await kill_all(api.store, RecordingProvider(), 1)
    discard = await api.client.post(f"/dashboard/dead-letters/{dead}/discard",
                                    data={"csrf": token, "reason": "gone\0"})
    assert discard.status_code == 400 and "reason contains a NUL" in discard.text
    entry = await api.store.dead_letter(dead)
    assert entry is not None and entry.discarded_at is None
    replay = await api.client.post("/dashboard/dead-letters/replay",
                                   data={"csrf": token, "import_id": "x\0"})
    assert replay.status_code == 400 and "import id contains a NUL" in replay.text
    one = await api.client.post(f"/dashboard/dead-letters/{dead}/replay",
                                data={"csrf": token, "back_to": "/dashboard\0"})
    assert one.status_code == 400
    entry = await api.store.dead_letter(dead)
    assert entry is not None and entry.replay_count == 0
    paused = await api.client.post("/dashboard/imports/im%00p/pause", data={"csrf": token})
    assert paused.status_code == 400
    assert not any("\0" in name for name in await api.store.get_controls())


async def test_a_signed_ses_event_that_cannot_be_stored_is_malformed(store: Store,
                                                                     side: SideDB) -> None:
    deep: Any = "x"
    for _ in range(100):
        deep = [deep]
    for event, why in [
        ({"eventType": "Delivery", "mail": {"messageId": "m\0", "destination": ["a@b.c"]}},
         "NUL"),
        ({"eventType": "Bounce", "mail": {"messageId": "m", "destination": ["\ud800@b.c"]}},
         "lone surrogate"),
        ({"eventType": "Delivery", "mail": {"messageId": "m", "tags": deep}}, "deeper than"),
    ]:
        async with stand_in() as host:  # the SNS certificate host, on loopback
            with pytest.raises(WebhookMalformed, match=why):
                await receive(store, "ses", {}, sns_body(event), config(host))
    assert side.count("postlane_provider_events") == 0
