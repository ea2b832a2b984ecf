"""Deliverability end to end, on both engines: one-click unsubscribe from the header on the
wire (a real SMTP server on loopback) through ``postlane serve``'s POST to the next send;
an asynchronous bounce (a DSN) posted to the ``smtp`` intake and matched by Message-ID;
Postmark's webhooks with its credentials; and the Maildir reader."""

from __future__ import annotations

import asyncio
import base64
import json
import mailbox
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner, Result

from postlane import Message, State
from postlane.cli.main import app
from postlane.core.lanes import LaneConfig
from postlane.core.unsubscribe import UnsubscribeConfig
from postlane.providers.smtp import SMTPProvider
from postlane.store import Store
from postlane.worker import Worker
from tests.conftest import SideDB, store_url
from tests.integration.test_api import Api, api  # noqa: F401  (the fixture)
from tests.integration.test_provider_smtp import Handler, provider, smtp_server
from tests.integration.worker_helpers import fast_config

pytestmark = pytest.mark.asyncio

SECRET = "unsubscribe-secret-0123456789abcdef"
INBOUND = "inbound-secret-0123456789"
POSTMARK = "postmark-hook-secret-0123"
LANES = (LaneConfig("interactive", 0.7, max_attempts=6),
         LaneConfig("bulk", 0.3, max_attempts=8, bulk=True))
UNSUBSCRIBE = UnsubscribeConfig((SECRET.encode(),), "https://mail.example.com",
                                "unsubscribe@example.com")


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTLANE_UNSUBSCRIBE_SECRET", SECRET)
    monkeypatch.setenv("POSTLANE_WEBHOOK_SECRET_SMTP", INBOUND)
    monkeypatch.setenv("POSTLANE_WEBHOOK_SECRET_POSTMARK", f"old-secret-xyz,{POSTMARK}")


async def drain(store: Store, smtp: SMTPProvider) -> None:
    await Worker(store, smtp, config=fast_config(
        drain=True, lanes=LANES, unsubscribe=UNSUBSCRIBE)).run()


def received(handler: Handler) -> dict[str, EmailMessage]:
    """What arrived at the server, by idempotency key."""
    found = {}
    for envelope in handler.received:
        parsed = message_from_bytes(envelope.original_content or b"", policy=default)
        assert isinstance(parsed, EmailMessage)
        found[str(parsed["X-Postlane-Key"])] = parsed
    return found


def bulk(key: str, to: str) -> Message:
    return Message(key=key, to=to, subject="Your digest", text="News.", lane="bulk")


def reset(key: str, to: str) -> Message:
    return Message(key=key, to=to, subject="Reset", text="Code 1234.", lane="interactive")


async def test_one_click_unsubscribe_from_the_wire_to_the_next_send(api: Api) -> None:
    store = api.store
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?from=news@example.org") as smtp:
        digest = await store.enqueue(bulk("digest:1", "ada@example.com"))
        await store.enqueue(reset("reset:1", "ada@example.com"))
        await drain(store, smtp)

        wire = received(handler)
        # The bulk message carries the pair, unencoded, one URL per line; the reset neither.
        raw = next(e.original_content for e in handler.received
                   if b"digest:1" in (e.original_content or b""))
        assert raw is not None and b"=?utf-8?" not in raw
        assert b"List-Unsubscribe: <https://mail.example.com/unsubscribe/" in raw
        assert wire["digest:1"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        https, mailto = [t.strip(" <>") for t in str(wire["digest:1"]["List-Unsubscribe"])
                         .split(",")]
        assert mailto.startswith("mailto:unsubscribe@example.com?subject=unsubscribe%20")
        assert "List-Unsubscribe" not in wire["reset:1"]
        assert "List-Unsubscribe-Post" not in wire["reset:1"]
        path = urlsplit(https).path

        # GET shows the page and changes nothing (link scanners follow links).
        page = await api.client.get(path)
        assert page.status_code == 200 and 'method="post"' in page.text
        assert "ada@example.com" in page.text
        assert await store.list_suppressions("ada@example.com") == []

        # The one-click POST, as a mail client sends it: no session, the token is all.
        form = {"content": b"List-Unsubscribe=One-Click",
                "headers": {"Content-Type": "application/x-www-form-urlencoded"}}
        done = await api.client.post(path, **form)  # type: ignore[arg-type]
        assert done.status_code == 200 and "unsubscribed" in done.text
        again = await api.client.post(path, **form)  # type: ignore[arg-type]
        assert again.status_code == 200
        [entry] = await store.list_suppressions("ada@example.com")
        assert (entry.stream, entry.reason, entry.expires_at) == ("bulk", "unsubscribed", None)
        assert entry.source_event == f"postlane:unsubscribe:bulk:{digest.id}"
        kinds = [e.kind for e in await store.timeline(digest.id)]
        assert kinds.count("provider:unsubscribed") == 1

        # A forged or altered token is refused and records nothing.
        forged = path[:-3] + ("AAA" if not path.endswith("AAA") else "BBB")
        assert (await api.client.post(forged, **form)).status_code == 400  # type: ignore[arg-type]
        assert (await api.client.get("/unsubscribe/not-a-token")).status_code == 400

        # The next bulk send to the address ends suppressed; the reset still goes.
        later = await store.enqueue(bulk("digest:2", "Ada@Example.com"))
        code = await store.enqueue(reset("reset:2", "ada@example.com"))
        await drain(store, smtp)
    after = await store.get(later.id)
    assert after is not None and after.state is State.SUPPRESSED
    sent = await store.get(code.id)
    assert sent is not None and sent.state is State.SENT
    assert "digest:2" not in received(handler) and "reset:2" in received(handler)


def dsn(original: EmailMessage, *, action: str = "failed", status: str = "5.1.1",
        report_id: str = "<dsn-1@mx.example.net>") -> bytes:
    """A delivery status notification (RFC 3464) as a receiving MTA writes it."""
    recipient = str(original["To"])
    return (
        f"From: MAILER-DAEMON@mx.example.net\r\nTo: news@example.org\r\n"
        f"Subject: Undelivered Mail Returned to Sender\r\nMessage-ID: {report_id}\r\n"
        f"MIME-Version: 1.0\r\n"
        f"Content-Type: multipart/report; report-type=delivery-status; boundary=\"B\"\r\n\r\n"
        f"--B\r\nContent-Type: text/plain\r\n\r\nThe mail system could not deliver it.\r\n"
        f"--B\r\nContent-Type: message/delivery-status\r\n\r\n"
        f"Reporting-MTA: dns; mx.example.net\r\n\r\n"
        f"Final-Recipient: rfc822; {recipient}\r\nAction: {action}\r\nStatus: {status}\r\n"
        f"Diagnostic-Code: smtp; 550 {status} no such user\r\n\r\n"
        f"--B\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        f"Message-ID: {original['Message-ID']}\r\nX-Postlane-Key: {original['X-Postlane-Key']}"
        f"\r\nTo: {recipient}\r\nSubject: {original['Subject']}\r\n\r\n--B--\r\n"
    ).encode()


def basic(secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"postlane:{secret}".encode())
            .decode()}


async def test_an_smtp_bounce_is_matched_by_message_id_and_suppresses(api: Api) -> None:
    store = api.store
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?from=news@example.org") as smtp:
        first = await store.enqueue(reset("welcome:1", "gone@example.com"))
        await drain(store, smtp)
        report = dsn(received(handler)["welcome:1"])

        unauthenticated = await api.client.post("/v1/webhooks/smtp", content=report)
        assert unauthenticated.status_code == 401
        answer = await api.client.post("/v1/webhooks/smtp", content=report,
                                       headers=basic(INBOUND))
        assert answer.status_code == 200, answer.text
        [event] = answer.json()["events"]
        assert (event["kind"], event["delivery_id"], event["duplicate"]) == (
            "bounced", first.id, False)
        repeat = await api.client.post(f"/v1/webhooks/smtp?token={INBOUND}", content=report)
        assert repeat.json()["events"][0]["duplicate"] is True

        [entry] = await store.list_suppressions("gone@example.com")
        assert (entry.stream, entry.reason) == ("*", "hard bounce")
        assert entry.source_event == "smtp:<dsn-1@mx.example.net>:gone@example.com"
        timeline = await store.timeline(first.id)
        bounced = [e for e in timeline if e.kind == "provider:bounced"]
        assert bounced and bounced[0].data["status"] == "5.1.1"

        nxt = await store.enqueue(reset("reset:gone", "gone@example.com"))
        await drain(store, smtp)
    delivery = await store.get(nxt.id)
    assert delivery is not None and delivery.state is State.SUPPRESSED


async def test_repeated_soft_bounces_suppress_for_a_while_and_removing_releases(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_THRESHOLD", "2")
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_SUPPRESS_FOR", "3d")
    store = api.store
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?from=news@example.org") as smtp:
        for i in (1, 2):
            await store.enqueue(bulk(f"digest:{i}", "full@example.com"))
        await drain(store, smtp)
        wire = received(handler)
        first = await api.client.post(
            "/v1/webhooks/smtp", headers=basic(INBOUND),
            content=dsn(wire["digest:1"], status="4.2.2", report_id="<s1@mx>"))
        assert first.json()["events"][0]["kind"] == "soft_bounced"
        assert await store.list_suppressions("full@example.com") == []  # one is no reason
        await api.client.post("/v1/webhooks/smtp", headers=basic(INBOUND),
                              content=dsn(wire["digest:2"], status="5.2.2",
                                          report_id="<s2@mx>"))
        [entry] = await store.list_suppressions("full@example.com")
        assert (entry.stream, entry.reason) == ("*", "2 soft bounces")
        assert entry.expires_at is not None
        with SideDB(store_url(store)) as side:
            days = (entry.expires_at - side.now()).total_seconds() / 86400
        assert 2.9 < days <= 3.0

        held = await store.enqueue(reset("reset:full", "full@example.com"))
        await drain(store, smtp)
        assert (await store.get(held.id)).state is State.SUPPRESSED  # type: ignore[union-attr]
        # Removing it releases what it held, with the same key (as suppress remove --replay).
        assert await store.unsuppress("full@example.com") == 1
        assert await store.requeue_suppressed("full@example.com") == [held.id]
        await drain(store, smtp)
    assert (await store.get(held.id)).state is State.SENT  # type: ignore[union-attr]
    assert "reset:full" in received(handler)


def postmark_bounce(message_id: str, email: str, kind: str = "HardBounce",
                    bounce_id: int = 42) -> dict[str, Any]:
    """Postmark's bounce webhook body, as its documentation shows it."""
    return {"RecordType": "Bounce", "MessageStream": "outbound", "ID": bounce_id,
            "Type": kind, "TypeCode": 1, "Name": "Hard bounce", "Tag": "digest",
            "MessageID": message_id, "ServerID": 23, "Description": "The server was unable "
            "to deliver your message (ex: unknown user, mailbox not found).",
            "Details": "smtp;550 5.1.1 unknown user", "Email": email,
            "From": "news@example.org", "BouncedAt": "2026-12-01T10:00:00Z",
            "DumpAvailable": True, "Inactive": True, "CanActivate": True,
            "Subject": "Your digest", "Metadata": {}}


async def test_postmark_webhooks_need_their_credentials_and_normalise(api: Api) -> None:
    store = api.store
    result = await store.enqueue(bulk("digest:pm", "pm@example.com"))
    with SideDB(store_url(store)) as side:  # as if Postmark had accepted it
        side.query("UPDATE postlane_deliveries SET state = 'sent', "
                   "provider_message_id = 'b7bc2f4a-e38e-4336-af7d-e6c392c2f817' WHERE id = ?",
                   (result.id,))
        side.shift(result.id, "finished_at", 0)
    body = json.dumps(postmark_bounce("b7bc2f4a-e38e-4336-af7d-e6c392c2f817",
                                      "pm@example.com")).encode()
    hook = "/v1/webhooks/postmark"
    assert (await api.client.post(hook, content=body)).status_code == 401
    assert (await api.client.post(hook, content=body, headers=basic("wrong"))).status_code == 401
    assert (await api.client.post(f"{hook}?token=wrong", content=body)).status_code == 401
    answer = await api.client.post(hook, content=body, headers=basic(POSTMARK))
    assert answer.status_code == 200, answer.text
    assert answer.json()["events"][0]["kind"] == "bounced"
    assert answer.json()["events"][0]["delivery_id"] == result.id
    # The rotated-out secret still verifies during the rotation; the event is a duplicate.
    again = await api.client.post(f"{hook}?token=old-secret-xyz", content=body)
    assert again.json()["events"][0]["duplicate"] is True
    complaint = {"RecordType": "SpamComplaint", "ID": 43, "Type": "SpamComplaint",
                 "TypeCode": 512, "MessageID": "b7bc2f4a-e38e-4336-af7d-e6c392c2f817",
                 "Email": "pm@example.com", "MessageStream": "outbound"}
    answer = await api.client.post(hook, content=json.dumps(complaint).encode(),
                                   headers=basic(POSTMARK))
    assert answer.json()["events"][0]["kind"] == "complained"
    streams = {s.stream: s.reason for s in await store.list_suppressions("pm@example.com")}
    assert streams == {"*": "hard bounce", "bulk": "complaint"}
    status = (await api.client.get("/v1/status", headers={
        "Authorization": f"Bearer {api.tokens['read']}"})).json()
    lane = status["deliverability"]["lanes"]["bulk"]
    assert (lane["sent"], lane["bounced"], lane["complained"]) == (1, 1, 1)
    assert lane["bounce_rate"] == 1.0
    metrics = (await api.client.get("/metrics")).text
    assert 'postlane_provider_events_total{kind="bounced",lane="bulk"} 1.0' in metrics


async def test_the_maildir_reader_records_each_report_once(store: Store, tmp_path: Path) -> None:
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?from=news@example.org") as smtp:
        sent = await store.enqueue(bulk("digest:md", "md@example.com"))
        await drain(store, smtp)
    original = received(handler)["digest:md"]
    box = mailbox.Maildir(tmp_path / "bounces", create=True)
    box.add(dsn(original, report_id="<md-1@mx>"))
    box.add(b"From: someone@example.net\r\nSubject: hello\r\n\r\nnot a bounce\r\n")
    token = str(original["List-Unsubscribe"]).split("subject=unsubscribe%20")[1].rstrip(">")
    box.add(f"From: md@example.com\r\nTo: unsubscribe@example.com\r\n"
            f"Subject: unsubscribe {token}\r\n\r\n".encode())
    url = store_url(store)
    runner = CliRunner()

    async def cli(*args: str) -> Result:  # the CLI runs its own event loop: in a thread
        return await asyncio.to_thread(runner.invoke, app, ["--db", url, *args])

    first = await cli("bounces", "maildir", str(tmp_path / "bounces"), "--json")
    assert first.exit_code == 0, first.output
    run = json.loads(first.output.strip().splitlines()[-1])
    assert (run["read"], run["not_reports"]) == (2, 1)
    assert sorted(e["kind"] for e in run["events"]) == ["bounced", "unsubscribed"]
    assert all(e["delivery_id"] == sent.id for e in run["events"])
    second = await cli("bounces", "maildir", str(tmp_path / "bounces"), "--json")
    assert json.loads(second.output.strip().splitlines()[-1])["read"] == 0  # marked seen
    streams = {s.stream: s.reason for s in await store.list_suppressions("md@example.com")}
    assert streams == {"*": "hard bounce", "bulk": "unsubscribed"}
    bad = await cli("bounces", "maildir", str(tmp_path))
    assert bad.exit_code == 2 and "not a Maildir" in bad.output
