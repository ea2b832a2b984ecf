"""The HTTP API in-process (httpx over ASGI, the app's lifespan run), on both engines.

Idempotent POST, scopes, size and shape of bodies, problem details, the staged replay of
dead letters through the API (with a real worker sending), pauses, status and metrics.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import msg, store_url
from worker_helpers import fast_config

from postlane import State
from postlane.api import create_app
from postlane.api.keys import create_key
from postlane.core.outcomes import Outcome
from postlane.metrics import WorkerMetrics
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.worker import Worker
from postlane.worker.controls import LANE_PAUSE

PROBLEM = "application/problem+json"


@dataclass
class Api:
    client: httpx.AsyncClient
    store: Store
    url: str
    tokens: dict[str, str]
    """Scope set ("send", "read,operate", "all") -> token."""

    def auth(self, scopes: str = "all") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[scopes]}"}

    async def send(self, key: str | None, body: dict[str, Any], **headers: str) -> httpx.Response:
        h = {**self.auth("send"), **headers}
        if key is not None:
            h["Idempotency-Key"] = key
        return await self.client.post("/v1/messages", json=body, headers=h)


@pytest.fixture
async def api(store: Store) -> AsyncIterator[Api]:
    tokens = {}
    for scopes in ("send", "read", "operate", "read,operate", "send,read,operate"):
        _, token = await create_key(store, scopes, name=scopes.replace(",", "+"))
        tokens[scopes] = token
    tokens["all"] = tokens["send,read,operate"]
    app = create_app(store_url(store), sample_interval_s=0)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield Api(client, store, store_url(store), tokens)


def body(**overrides: Any) -> dict[str, Any]:
    return {"to": "ada@example.com", "subject": "Reset your password",
            "text": "Follow the link.", **overrides}


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    data: dict[str, Any] = response.json()
    assert data["status"] == status
    assert data["type"] and data["title"] and data["detail"]
    return data


# -- idempotent POST ---------------------------------------------------------------------
async def test_ten_concurrent_posts_with_one_key_make_one_delivery(api: Api) -> None:
    responses = await asyncio.gather(*(api.send("reset:42", body()) for _ in range(10)))
    assert [r.status_code for r in responses] == [201] * 10, [r.text for r in responses]
    ids = {r.json()["id"] for r in responses}
    assert len(ids) == 1
    assert len({r.content for r in responses}) == 1  # the original answer, byte for byte
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == 9
    found = await api.store.find_deliveries(key="reset:42")
    assert [d.id for d in found] == list(ids)
    assert responses[0].headers["Location"] == f"/v1/messages/{found[0].id}"

    changed = await api.send("reset:42", body(subject="Something else"))
    data = problem(changed, 422)
    assert data["type"].endswith("idempotency-key-reused")
    assert data["field"] == "Idempotency-Key"
    assert "different body" in data["detail"]
    assert len(await api.store.find_deliveries(key="reset:42")) == 1


async def test_the_same_body_in_another_spelling_is_the_same_request(api: Api) -> None:
    first = await api.send("welcome:7", body())
    again = await api.client.post(
        "/v1/messages", headers={**api.auth("send"), "Idempotency-Key": "welcome:7",
                                 "Content-Type": "application/json"},
        content=json.dumps({"text": "Follow the link.", "lane": "interactive",
                            "subject": "Reset your password", "to": "ada@example.com"},
                           indent=2))
    assert again.status_code == 201 and again.json() == first.json()


async def test_a_key_enqueued_outside_the_api_is_not_claimed_by_a_request(api: Api) -> None:
    await api.store.enqueue(msg("outbox:1"))
    data = problem(await api.send("outbox:1", body()), 409)
    assert data["type"].endswith("key-conflict") and data["field"] == "Idempotency-Key"
    assert "the application" in data["detail"]


async def test_post_without_idempotency_key_is_refused_with_400(api: Api) -> None:
    data = problem(await api.send(None, body()), 400)
    assert "Idempotency-Key" in data["detail"]
    assert data["type"].endswith("missing-header")


async def test_invalid_messages_say_which_field(api: Api) -> None:
    data = problem(await api.send("k:1", body(to="not-an-address")), 422)
    assert data["field"] == "to" and "local part and domain" in data["detail"]
    data = problem(await api.send("k:2", body(lane="nope")), 422)
    assert data["field"] == "lane" and "unknown lane 'nope'" in data["detail"]
    data = problem(await api.send("k:3", body(headers={"X-Bad": "a\r\nBcc: x@y.z"})), 422)
    assert data["field"] == "headers"
    data = problem(await api.send("k:4", body(colour="blue")), 422)
    assert data["errors"][0]["location"] == "body.colour"
    data = problem(await api.send("k:5", body(text="nul\x00byte")), 422)
    assert "NUL" in data["detail"]
    data = problem(await api.send("k:6", body(expires_in_s=-5)), 422)
    assert data["errors"][0]["location"] == "body.expires_in_s"
    data = problem(await api.send("   ", body()), 422)
    assert data["errors"][0]["location"] == "header.Idempotency-Key"
    assert await api.store.find_deliveries(recipient="ada@example.com") == []


async def test_malformed_and_oversized_bodies(api: Api) -> None:
    headers = {**api.auth("send"), "Idempotency-Key": "k:1",
               "Content-Type": "application/json"}
    data = problem(await api.client.post("/v1/messages", headers=headers,
                                         content=b'{"to": "a@example.com",'), 400)
    assert "not valid JSON" in data["detail"]
    data = problem(await api.client.post("/v1/messages", headers=headers, content=b"[1, 2]"),
                   422)
    assert data["errors"]
    # POST /v1/messages takes up to 16 MiB (attachments travel in it as base64).
    big = json.dumps(body(text="x" * (16 * 1024 * 1024))).encode()
    data = problem(await api.client.post("/v1/messages", headers=headers, content=big), 413)
    assert "limit is 16777216 bytes" in data["detail"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(260):
            yield b" " * 65536

    data = problem(await api.client.post("/v1/messages", headers=headers, content=chunks()),
                   413)
    assert await api.store.find_deliveries(key="k:1") == []


# -- scopes ------------------------------------------------------------------------------
ROUTES = [
    ("POST", "/v1/messages", "send"),
    ("GET", "/v1/messages/1", "read"),
    ("GET", "/v1/messages?key=x", "read"),
    ("POST", "/v1/messages/1/cancel", "operate"),
    ("POST", "/v1/messages/1/resolve", "operate"),
    ("POST", "/v1/messages/cancel", "operate"),
    ("POST", "/v1/messages/resolve", "operate"),
    ("GET", "/v1/dead-letters", "read"),
    ("GET", "/v1/dead-letters/1", "read"),
    ("GET", "/v1/status", "read"),
    ("POST", "/v1/dead-letters/1/replay", "operate"),
    ("POST", "/v1/dead-letters/replay", "operate"),
    ("POST", "/v1/dead-letters/1/discard", "operate"),
    ("POST", "/v1/lanes/bulk/pause", "operate"),
    ("POST", "/v1/lanes/bulk/resume", "operate"),
    ("GET", "/v1/templates", "read"),
    ("GET", "/v1/templates/welcome", "read"),
    ("POST", "/v1/templates/welcome/deprecate", "operate"),
    ("DELETE", "/v1/templates/welcome", "operate"),
    ("GET", "/v1/imports", "read"),
    ("GET", "/v1/imports/spring", "read"),
    ("POST", "/v1/imports/spring/pause", "operate"),
    ("POST", "/v1/imports/spring/resume", "operate"),
]


@pytest.mark.parametrize(("method", "path", "scope"), ROUTES)
async def test_each_route_enforces_its_scope(api: Api, method: str, path: str,
                                             scope: str) -> None:
    payload: dict[str, Any] | None = {"reason": "x"} if path.endswith("discard") else None
    if path == "/v1/messages":
        payload = body()

    async def call(headers: dict[str, str]) -> httpx.Response:
        return await api.client.request(method, path, json=payload,
                                        headers={"Idempotency-Key": "scope:1", **headers})

    anonymous = await call({})
    problem(anonymous, 401)
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    problem(await call({"Authorization": "Bearer pl_not-a-key"}), 401)
    problem(await call({"Authorization": "Basic dXNlcjpwYXNz"}), 401)
    for others in ("send", "read", "operate"):
        if others != scope:
            data = problem(await call(api.auth(others)), 403)
            assert repr(scope) in data["detail"]
    allowed = await call(api.auth(scope))
    assert allowed.status_code not in (401, 403), allowed.text


async def test_a_revoked_key_is_refused_at_once(api: Api) -> None:
    key, token = await create_key(api.store, "read", name="leaving")
    headers = {"Authorization": f"Bearer {token}"}
    assert (await api.client.get("/v1/status", headers=headers)).status_code == 200
    assert await api.store.revoke_api_key(key.id)
    data = problem(await api.client.get("/v1/status", headers=headers), 401)
    assert "revoked" in data["detail"]
    stored = await api.store.get_api_key(key_id=key.id)
    assert stored is not None and token not in repr(stored)  # only the hash is kept


# -- reading -----------------------------------------------------------------------------
async def test_a_message_with_its_timeline_and_search(api: Api) -> None:
    created = (await api.send("receipt:9", body(to="bob@example.com"))).json()
    response = await api.client.get(f"/v1/messages/{created['id']}", headers=api.auth("read"))
    assert response.status_code == 200
    data = response.json()
    assert data["message"]["key"] == "receipt:9" and data["message"]["state"] == "pending"
    assert [e["kind"] for e in data["timeline"]] == ["enqueued"]
    for query in ("key=receipt:9", "recipient=bob@example.com"):
        found = await api.client.get(f"/v1/messages?{query}", headers=api.auth("read"))
        assert [m["id"] for m in found.json()["messages"]] == [created["id"]]
    problem(await api.client.get("/v1/messages?state=stuck", headers=api.auth("read")), 422)
    problem(await api.client.get("/v1/messages/999999", headers=api.auth("read")), 404)
    problem(await api.client.get("/v1/messages/0", headers=api.auth("read")), 422)


async def test_status_is_the_cli_status(api: Api, tmp_path: Path) -> None:
    await api.send("a:1", body())
    paused = await api.client.post("/v1/lanes/bulk/pause", headers=api.auth("operate"))
    assert paused.json() == {"lane": "bulk", "paused": True}
    assert LANE_PAUSE + "bulk" in await api.store.get_controls()
    problem(await api.client.post("/v1/lanes/nope/pause", headers=api.auth("operate")), 404)
    via_api = (await api.client.get("/v1/status", headers=api.auth("read"))).json()
    cli = subprocess.run(
        [str(Path(sys.executable).with_name("postlane")), "--db", api.url, "status", "--json"],
        capture_output=True, text=True, check=True, cwd=tmp_path)
    via_cli = json.loads(cli.stdout)
    for data in (via_api, via_cli):  # ages move between the two readings
        for lane in data["lanes"].values():
            lane["oldest_age_s"] = round(lane["oldest_age_s"] > 0)
    assert via_api == via_cli
    assert via_api["paused_lanes"] == ["bulk"]
    resumed = await api.client.post("/v1/lanes/bulk/resume", headers=api.auth("operate"))
    assert resumed.json() == {"lane": "bulk", "paused": False}
    assert LANE_PAUSE + "bulk" not in await api.store.get_controls()


# -- dead letters: staged replay ---------------------------------------------------------
async def drain(store: Store, provider: RecordingProvider) -> Worker:
    worker = Worker(store, provider, config=fast_config(drain=True))
    await worker.run()
    return worker


async def test_dead_letter_replay_through_the_api_follows_the_canary_rule(api: Api) -> None:
    provider = RecordingProvider()
    ids = []
    for i in range(4):
        created = await api.send(f"digest:{i}", body(lane="bulk", to=f"u{i}@example.com"))
        provider.script_key(f"digest:{i}", Outcome.permanent("550 5.1.1 mailbox unavailable"))
        ids.append(created.json()["id"])
    await drain(api.store, provider)
    ops = api.auth("operate")
    read = api.auth("read")

    listed = (await api.client.get("/v1/dead-letters?reason=permanent", headers=read)).json()
    # Listed oldest death first; the four died in one drain, in whichever order their sends
    # finished and their acks were flushed.
    assert sorted(e["delivery_id"] for e in listed["dead_letters"]) == ids
    assert listed["by_reason"] == {"permanent": 4}
    detail = (await api.client.get(f"/v1/dead-letters/{ids[0]}", headers=read)).json()
    assert detail["last_response"] == "550 5.1.1 mailbox unavailable"
    assert detail["snapshot"]["idempotency_key"] == "digest:0"
    assert detail["attempt_history"]

    selection = {"reason": "permanent", "lane": "bulk"}
    refused = problem(await api.client.post("/v1/dead-letters/replay", json=selection,
                                            headers=ops), 409)
    assert "replay one entry of this selection first" in refused["detail"]

    # A dry run of the canary checks and replays nothing.
    dry_one = await api.client.post(f"/v1/dead-letters/{ids[0]}/replay",
                                    json={"dry_run": True}, headers=ops)
    assert dry_one.status_code == 200, dry_one.text
    assert dry_one.json()["replayed"] is False and "nothing was replayed" in dry_one.json()["next"]
    untouched = (await api.client.get(f"/v1/dead-letters/{ids[0]}", headers=read)).json()
    assert (untouched["replay_count"], untouched["replayed_at"]) == (0, None)
    still_dead = await api.store.get(ids[0])
    assert still_dead is not None and still_dead.state == State.DEAD

    canary = await api.client.post(f"/v1/dead-letters/{ids[0]}/replay", headers=ops)
    assert canary.status_code == 200, canary.text
    assert canary.json()["key"] == "digest:0" and canary.json()["replayed"]
    refused = problem(await api.client.post("/v1/dead-letters/replay", json=selection,
                                            headers=ops), 409)
    assert "canary has not been sent yet" in refused["detail"]
    again = problem(await api.client.post(f"/v1/dead-letters/{ids[0]}/replay", headers=ops),
                    409)
    assert "not dead" in again["detail"]

    await drain(api.store, provider)  # the cause is fixed: the canary goes out
    sent = await api.store.get(ids[0])
    assert sent is not None and sent.state is State.SENT and sent.key == "digest:0"

    dry = await api.client.post("/v1/dead-letters/replay", json={**selection, "dry_run": True},
                                headers=ops)
    assert {**dry.json(), "replayed": sorted(dry.json()["replayed"])} == {
        "canary": ids[0], "replayed": ids[1:], "skipped_expired": [], "dry_run": True}
    discarded = await api.client.post(f"/v1/dead-letters/{ids[3]}/discard",
                                      json={"reason": "customer left"}, headers=ops)
    assert discarded.json() == {"delivery_id": ids[3], "discarded": True,
                                "reason": "customer left"}
    problem(await api.client.post(f"/v1/dead-letters/{ids[3]}/discard",
                                  json={"reason": "twice"}, headers=ops), 409)
    problem(await api.client.post("/v1/dead-letters/999999/discard",
                                  json={"reason": "x"}, headers=ops), 404)
    problem(await api.client.post("/v1/dead-letters/999999/replay", headers=ops), 404)
    problem(await api.client.post(f"/v1/dead-letters/{ids[1]}/discard", json={},
                                  headers=ops), 422)

    rest = await api.client.post("/v1/dead-letters/replay", json=selection, headers=ops)
    assert {**rest.json(), "replayed": sorted(rest.json()["replayed"])} == {
        "canary": ids[0], "replayed": ids[1:3], "skipped_expired": [], "dry_run": False}
    await drain(api.store, provider)
    for delivery_id in ids[:3]:
        delivery = await api.store.get(delivery_id)
        assert delivery is not None and delivery.state is State.SENT
    entry = (await api.client.get(f"/v1/dead-letters/{ids[1]}", headers=read)).json()
    assert entry["replayed_by"] == "apikey:operate#3" and entry["replay_count"] == 1
    # Never bulk-replayed twice: a second bulk replay finds nothing left to take.
    rest = await api.client.post("/v1/dead-letters/replay", json=selection, headers=ops)
    assert rest.json()["replayed"] == []


# -- metrics -----------------------------------------------------------------------------
async def test_metrics_from_the_store_at_scrape_time(api: Api) -> None:
    await api.send("m:1", body(lane="bulk"))
    await api.client.post("/v1/lanes/interactive/pause", headers=api.auth("operate"))
    await asyncio.sleep(1.1)  # past the one-second reuse of a reading
    response = await api.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    for line in ('postlane_queue_depth{lane="bulk"} 1.0',
                 'postlane_queue_depth{lane="interactive"} 0.0',
                 'postlane_queue_by_attempt{attempt="1"} 1.0',
                 'postlane_deliveries{state="pending"} 1.0',
                 'postlane_dead_letters_open{reason="permanent"} 0.0',
                 'postlane_lane_paused{lane="interactive"} 1.0',
                 'postlane_lane_paused{lane="bulk"} 0.0',
                 'postlane_enqueued_total{lane="bulk"} 1.0',
                 'postlane_enqueued_total{lane="interactive"} 0.0',
                 'postlane_dead_letters_open_by_cause{cause="unknown_template"} 0.0'):
        assert line in text, line
    assert 'postlane_queue_oldest_age_seconds{lane="bulk"}' in text
    assert "postlane_status_query_seconds " in text


async def test_worker_metrics_count_outcomes_dead_letters_and_latency(store: Store) -> None:
    provider = RecordingProvider()
    for i in range(3):
        await store.enqueue(msg(f"w:{i}", lane="bulk"))
    provider.script_key("w:2", Outcome.permanent("550 no such user"))
    worker = Worker(store, provider, config=fast_config(drain=True))
    metrics = WorkerMetrics(worker)
    before = metrics.render().decode()
    assert ('postlane_dead_letter_arrivals_total{cause="rejected_recipient",lane="bulk",'
            'provider="recording",reason="permanent"} 0.0') in before
    await worker.run()
    text = metrics.render().decode()
    for line in ('postlane_sends_total{lane="bulk",outcome="accepted",provider="recording"} 2.0',
                 'postlane_sends_total{lane="bulk",outcome="permanent",provider="recording"} 1.0',
                 'postlane_dead_letter_arrivals_total{cause="rejected_recipient",lane="bulk",'
                 'provider="recording",reason="permanent"} 1.0',
                 'postlane_dead_letter_arrivals_total{cause="unknown_template",lane="bulk",'
                 'provider="recording",reason="permanent"} 0.0',
                 'postlane_claim_age_seconds_count{lane="bulk"} 3.0',
                 "postlane_limiter_errors_total 0.0",
                 'postlane_send_duration_seconds_count{lane="bulk"} 3.0',
                 'postlane_enqueue_to_send_seconds_count{lane="bulk"} 2.0',
                 "postlane_limiter_waits_total 0.0",
                 "postlane_worker_claimed_total 3.0"):
        assert line in text, line
    server = metrics.serve(0)
    try:
        async with httpx.AsyncClient() as client:
            scraped = await client.get(f"http://127.0.0.1:{server.server_port}/metrics")
        assert ('postlane_sends_total{lane="bulk",outcome="accepted",provider="recording"} '
                '2.0') in scraped.text
    finally:
        server.shutdown()
        server.server_close()


# -- templates and imports ---------------------------------------------------------------
async def test_templates_through_the_api(api: Api) -> None:
    ops, read = api.auth("operate"), api.auth("read")
    created = await api.client.post("/v1/templates/welcome", headers=ops, json={
        "subject": "Welcome, {{ name }}", "text": "Hello {{ name }}"})
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 1
    second = await api.client.post("/v1/templates/welcome", headers=ops, json={
        "subject": "Welcome aboard, {{ name }}", "text": "Hello {{ name }}"})
    assert second.json()["version"] == 2
    first = await api.client.get("/v1/templates/welcome?version=1", headers=read)
    assert first.json()["subject"] == "Welcome, {{ name }}"
    assert first.json()["latest_version"] == 2
    listed = await api.client.get("/v1/templates", headers=read)
    assert [t["name"] for t in listed.json()["templates"]] == ["welcome"]
    data = problem(await api.client.post("/v1/templates/broken", headers=ops,
                                         json={"subject": "{{ oops"}), 422)
    assert data["field"]
    problem(await api.client.get("/v1/templates/nope", headers=read), 404)

    from postlane.templates import enqueue_template

    await enqueue_template(api.store, "welcome", {"name": "Ada"}, key="welcome:ada",
                           to="ada@example.com")
    in_use = problem(await api.client.delete("/v1/templates/welcome", headers=ops), 409)
    assert "still referenced by 1 delivery" in in_use["detail"]
    deprecated = await api.client.post("/v1/templates/welcome/deprecate", headers=ops)
    assert deprecated.json()["deprecated"] is True
    problem(await api.client.post("/v1/templates/nope/deprecate", headers=ops), 404)


async def test_imports_through_the_api(api: Api, tmp_path: Path) -> None:
    from postlane.imports import import_csv
    from postlane.templates import add_template

    await add_template(api.store, "welcome", subject="Hi {{ name }}", text="Hello {{ name }}")
    rows = "".join(f"{i},u{i}@example.com,User {i}\n" for i in range(5))
    (tmp_path / "spring.csv").write_text("user_id,email,name\n" + rows + "x,not-an-address,X\n")
    await import_csv(api.store, tmp_path / "spring.csv", template="welcome",
                     import_id="spring")
    read, ops = api.auth("read"), api.auth("operate")
    listed = (await api.client.get("/v1/imports", headers=read)).json()["imports"]
    assert [i["import_id"] for i in listed] == ["spring"]
    spring = (await api.client.get("/v1/imports/spring", headers=read)).json()
    assert spring["rows"] == {"read": 6, "enqueued": 5, "created": 5, "skipped": 1}
    assert spring["deliveries"]["queued"] == 5 and spring["paused"] is False
    paused = await api.client.post("/v1/imports/spring/pause", headers=ops)
    assert paused.json() == {"import_id": "spring", "paused": True}
    assert (await api.client.get("/v1/imports/spring", headers=read)).json()["paused"]
    await api.client.post("/v1/imports/spring/resume", headers=ops)
    assert not (await api.client.get("/v1/imports/spring", headers=read)).json()["paused"]
    problem(await api.client.get("/v1/imports/autumn", headers=read), 404)


# -- webhooks ----------------------------------------------------------------------------
async def test_webhook_route_answers_a_rejection_with_401(api: Api) -> None:
    data = problem(await api.client.post("/v1/webhooks/nobody", json={"type": "x"}), 401)
    assert data["type"].endswith("webhook-rejected")
