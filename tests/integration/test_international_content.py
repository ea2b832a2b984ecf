"""International content end to end: subjects, display names, bodies and addresses in
Cyrillic, Arabic, CJK and emoji, sent over a real SMTP server on loopback (aiosmtpd, with and
without SMTPUTF8) and through SES (moto), read back with the email package and compared
with what was enqueued.

What must hold (docs/content.md): without SMTPUTF8 every byte on the wire is 7-bit (RFC 2047
headers, quoted-printable or base64 bodies) and Unicode domains go as A-labels; an address
with a Unicode local part goes only with SMTPUTF8, as an RFC 6532 message, and is otherwise
refused as a permanent outcome before anything is sent -- never mangled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from email import message_from_bytes
from email.header import decode_header, make_header
from email.message import EmailMessage
from email.policy import default
from email.utils import getaddresses
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP as SMTPServer
from aiosmtpd.smtp import Envelope, Session
from conftest import msg

from postlane.core.outcomes import OutcomeClass
from postlane.core.states import State
from postlane.providers.mime import message_id
from postlane.providers.smtp import SMTPProvider
from postlane.store import Store
from postlane.worker import Worker, WorkerConfig
from tests.factories import delivery
from tests.integration.test_api import Api, api, body, problem  # noqa: F401 (the fixture)
from tests.integration.test_provider_ses import (  # noqa: F401 (fixtures)
    moto,
    moto_url,
    sent_messages,
    ses,
    ses_url,
)
from tests.integration.test_provider_smtp import Handler, provider, smtp_server


@dataclass(frozen=True)
class Script:
    subject: str
    text: str
    html: str
    name: str
    """A display name, carried by a Reply-To header (a Message's own addresses are bare)."""
    domain: str
    alabels: str
    local: str
    """A local part in the script: needs SMTPUTF8."""


SCRIPTS = {
    "cyrillic": Script(
        subject="Сброс пароля: ссылка действует 15 минут",
        text="Здравствуйте, Анна!\nПерейдите по ссылке, чтобы задать новый пароль.\n",
        html="<p>Здравствуйте, <b>Анна</b>!</p><p>Ссылка действует 15 минут.</p>",
        name="Служба поддержки «Пример»", domain="пример.рф",
        alabels="xn--e1afmkfd.xn--p1ai", local="анна.каренина"),
    "arabic": Script(
        subject="إعادة تعيين كلمة المرور الخاصة بك",
        text="مرحبا فاطمة،\nاتبعي الرابط لإعادة تعيين كلمة المرور.\n",
        html='<p dir="rtl">مرحبا <b>فاطمة</b>، اتبعي الرابط.</p>',
        name="فريق الدعم", domain="مثال.إختبار", alabels="xn--mgbh0fb.xn--kgbechtv",
        local="فاطمة"),
    "cjk": Script(
        # Long enough to be folded across several encoded words.
        subject="パスワードの再設定のお知らせ／重置密码通知／비밀번호 재설정 안내" * 2,
        text="山田様\n下記のリンクからパスワードを再設定してください。\n你好！\n안녕하세요!\n",
        html="<p>山田様</p><p>下記のリンクから再設定してください。</p>",
        name="山田 太郎", domain="例え.テスト", alabels="xn--r8jz45g.xn--zckzah",
        local="山田"),
    "emoji": Script(
        subject="Your order 📦 has shipped 🚀✨ (ETA: 2 days 🗓️)",
        text="Thanks 🙏 for your order!\nSee you soon 👋🏽 — the team 🦄\n",
        html="<p>Thanks 🙏 for your order! 👩🏽‍💻</p>",
        name="Ada 🦄 Lovelace", domain="bücher.de", alabels="xn--bcher-kva.de",
        local='"ada 🦄 lovelace"'),  # a quoted local part, RFC 6532 qtext
}


def international(script: Script, **changes: Any) -> Any:
    return delivery(**{
        "key": "welcome:intl", "sender": "app@example.org",
        "recipient": f"user@{script.domain}", "subject": script.subject,
        "text": script.text, "html": script.html,
        "headers": {"Reply-To": f"{script.name} <support@example.org>"}, **changes})


def read_back(raw: bytes) -> EmailMessage:
    parsed = message_from_bytes(raw, policy=default)
    assert isinstance(parsed, EmailMessage)
    assert not parsed.defects, parsed.defects
    return parsed


def utf8(value: str) -> str:
    """A header value of an RFC 6532 message as text: the bytes parser keeps raw UTF-8 in
    headers as surrogate escapes (a str parser would misread 8-bit bodies instead)."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8")


def addresses(parsed: EmailMessage, name: str) -> list[str]:
    return [utf8(a.addr_spec) for a in parsed[name].addresses]


def display_name(raw: bytes) -> str:
    """The Reply-To display name as RFC 2047 section 6.2 reads it: the white space between
    two adjacent encoded words is dropped. ``email.headerregistry`` keeps it inside a
    display name (``Прим ер``) before CPython's fix for gh-128110, so the name is decoded
    with the email package's ``email.header`` functions, which follow the RFC."""
    parsed = read_back(raw)
    if not raw.isascii():  # RFC 6532: the name is UTF-8 as it is, no encoded words
        return utf8(parsed["Reply-To"].addresses[0].display_name)
    legacy = message_from_bytes(raw)  # compat32: values as written
    ((name, _),) = getaddresses([str(legacy["Reply-To"])])
    return str(make_header(decode_header(name)))


def assert_same_content(raw: bytes, script: Script) -> None:
    """What the recipient reads is what was enqueued, character for character."""
    parsed = read_back(raw)
    assert utf8(str(parsed["Subject"])) == script.subject
    (reply_to,) = parsed["Reply-To"].addresses
    assert reply_to.addr_spec == "support@example.org"
    assert display_name(raw) == script.name
    plain = parsed.get_body(("plain",))
    html = parsed.get_body(("html",))
    assert plain is not None and html is not None
    assert plain.get_content().replace("\r\n", "\n") == script.text
    assert html.get_content().replace("\r\n", "\n").rstrip("\n") == script.html


# -- SMTP -----------------------------------------------------------------------------------
@pytest.mark.parametrize("smtputf8", [False, True], ids=["plain", "server-offers-smtputf8"])
@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_content_in_any_script_goes_7bit_and_reads_back_the_same(
        name: str, smtputf8: bool) -> None:
    """ASCII local parts: the message needs no extension, so it is 7-bit even where the
    server offers SMTPUTF8 (a relay further on may not); the domain goes as A-labels."""
    script = SCRIPTS[name]
    handler = Handler()
    async with smtp_server(handler, enable_SMTPUTF8=smtputf8) as server, \
            provider(f"smtp://127.0.0.1:{server.port}") as smtp:
        outcome = await smtp.send(international(script))
    assert outcome.kind is OutcomeClass.ACCEPTED, outcome.response
    (envelope,) = handler.received
    assert envelope.rcpt_tos == [f"user@{script.alabels}"]
    assert envelope.mail_from == "app@example.org"
    assert not envelope.smtp_utf8
    assert "SMTPUTF8" not in envelope.mail_options
    raw = envelope.original_content or b""
    assert raw.isascii(), "a byte beyond 7 bits without SMTPUTF8 or 8BITMIME"
    assert max(len(line) for line in raw.split(b"\r\n")) <= 78
    assert b"=?utf-8?" in raw  # the subject and the display name as RFC 2047 words
    parsed = read_back(raw)
    assert addresses(parsed, "To") == [f"user@{script.alabels}"]
    assert_same_content(raw, script)


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_a_unicode_local_part_goes_with_smtputf8_as_utf8(name: str) -> None:
    script = SCRIPTS[name]
    address = f"{script.local}@{script.domain}"
    sender = f"{script.local}@example.org"
    handler = Handler()
    async with smtp_server(handler, enable_SMTPUTF8=True) as server, \
            provider(f"smtp://127.0.0.1:{server.port}") as smtp:
        outcome = await smtp.send(international(script, recipient=address, sender=sender))
    assert outcome.kind is OutcomeClass.ACCEPTED, outcome.response
    assert outcome.provider_message_id == message_id("welcome:intl", sender)
    (envelope,) = handler.received
    assert envelope.smtp_utf8
    assert "BODY=8BITMIME" in envelope.mail_options  # RFC 6532 bodies may be 8-bit
    assert envelope.mail_from == sender
    assert envelope.rcpt_tos == [f"{script.local}@{script.alabels}"]
    raw = envelope.original_content or b""
    # RFC 6532: the headers are UTF-8 as they are, no encoded words.
    assert f"Subject: {script.subject[:20]}".encode() in raw
    assert f"To: {script.local}@{script.alabels}".encode() in raw
    assert b"=?utf-8?" not in raw.split(b"\r\n\r\n", 1)[0]
    parsed = read_back(raw)
    assert addresses(parsed, "To") == [f"{script.local}@{script.alabels}"]
    assert addresses(parsed, "From") == [sender]
    assert_same_content(raw, script)


class MailRecorder(Handler):
    """Records every MAIL command the server takes."""

    def __init__(self) -> None:
        super().__init__()
        self.mails: list[str] = []

    async def handle_MAIL(self, server: SMTPServer, session: Session, envelope: Envelope,
                          address: str, mail_options: list[str]) -> str:
        self.mails.append(address)
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"


async def test_a_unicode_local_part_without_smtputf8_is_refused_and_nothing_is_sent() -> None:
    handler = MailRecorder()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}") as smtp:
        refused = await smtp.send(international(SCRIPTS["cyrillic"],
                                                recipient="анна@пример.рф"))
        mails_before = list(handler.mails)
        after = await smtp.send(international(SCRIPTS["cyrillic"], key="welcome:next"))
    assert refused.kind is OutcomeClass.PERMANENT
    assert "does not offer SMTPUTF8" in (refused.response or "")
    assert "анна" not in (refused.response or "")  # no recipient address in the outcome
    assert mails_before == []  # not even MAIL: the server never saw the address
    # The session was left as it was and serves the next message.
    assert after.kind is OutcomeClass.ACCEPTED
    assert smtp.connections_opened == 1
    assert [e.rcpt_tos for e in handler.received] == [["user@xn--e1afmkfd.xn--p1ai"]]


async def test_the_worker_dead_letters_a_unicode_local_part_with_its_cause(
        store: Store) -> None:
    """Enqueue cannot know the provider: the refusal comes at send, a permanent dead letter
    whose cause says why, while the rest of the batch goes."""
    await store.enqueue_many([
        msg("intl:local", to="анна@пример.рф", sender="app@example.org",
            subject="Привет"),
        msg("intl:domain", to="anna@пример.рф", sender="app@example.org",
            subject="Привет"),
    ])
    handler = Handler()
    async with smtp_server(handler) as server:
        smtp = SMTPProvider.from_url(f"smtp://127.0.0.1:{server.port}")
        worker = Worker(store, smtp, config=WorkerConfig(
            drain=True, controls_interval_s=0.05, poll_interval_s=0.05))
        async with asyncio.timeout(30):
            await worker.run()
    refused = await store.get("intl:local")
    sent = await store.get("intl:domain")
    assert refused is not None and sent is not None
    assert refused.state is State.DEAD and refused.attempts == 1
    assert sent.state is State.SENT
    entry = await store.dead_letter(refused.id)
    assert entry is not None and entry.reason == "permanent"
    assert "SMTPUTF8" in (entry.last_response or "")
    assert entry.snapshot["recipient"] == "анна@пример.рф"  # kept verbatim for a replay
    assert [e.rcpt_tos for e in handler.received] == [["anna@xn--e1afmkfd.xn--p1ai"]]


# -- SES ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_ses_sends_content_in_any_script_and_a_unicode_domain_as_alabels(
        moto: str, name: str) -> None:
    script = SCRIPTS[name]
    async with ses(ses_url(moto)) as provider_:
        outcome = await provider_.send(international(script))
    assert outcome.kind is OutcomeClass.ACCEPTED, outcome.response
    (sent,) = sent_messages()
    assert set(sent.destinations) == {f"user@{script.alabels}"}
    raw = sent.raw_data.encode("utf-8") if isinstance(sent.raw_data, str) else sent.raw_data
    assert raw.isascii()
    parsed = read_back(raw)
    assert addresses(parsed, "To") == [f"user@{script.alabels}"]
    assert_same_content(raw, script)


async def test_ses_refuses_a_unicode_local_part_before_calling_it(
        moto: str) -> None:
    async with ses(ses_url(moto)) as provider_:
        outcome = await provider_.send(international(SCRIPTS["cjk"], recipient="山田@例え.テスト"))
    assert outcome.kind is OutcomeClass.PERMANENT
    assert "Amazon SES does not support SMTPUTF8" in (outcome.response or "")
    assert "山田" not in (outcome.response or "")
    assert sent_messages() == []


# -- the HTTP API's door ---------------------------------------------------------------------
async def test_the_api_takes_international_addresses_as_given(api: Api) -> None:
    response = await api.send("intl:api", body(to="анна@пример.рф", sender="app@bücher.de",
                                                subject=SCRIPTS["cjk"].subject))
    assert response.status_code == 201, response.text
    stored = await api.store.get("intl:api")
    assert stored is not None
    assert (stored.recipient, stored.sender) == ("анна@пример.рф", "app@bücher.de")
    assert stored.subject == SCRIPTS["cjk"].subject


@pytest.mark.parametrize(("to", "why"), [
    ("anna@☃.net", "IDNA 2008"),
    ("an\u200bna@example.com", "invisible format character"),
    ("u\u0308ser@example.com", "NFC"),
])
async def test_the_api_refuses_an_invalid_international_address_with_422(
        api: Api, to: str, why: str) -> None:
    data = problem(await api.send("intl:bad", body(to=to)), 422)
    assert data["field"] == "to" and why in data["detail"]
    assert await api.store.find_deliveries(key="intl:bad") == []


# -- suppressions: one mailbox, whichever form of its domain ----------------------------------
@pytest.mark.parametrize(("listed", "sent_to"), [
    ("anna@xn--e1afmkfd.xn--p1ai", "anna@пример.рф"),  # a bounce names the A-labels
    ("Anna@Пример.РФ", "anna@xn--e1afmkfd.xn--p1ai"),
])
async def test_a_suppression_matches_the_unicode_and_the_punycode_form(
        store: Store, listed: str, sent_to: str) -> None:
    await store.suppress(listed, "*", "hard_bounce")
    result = await store.enqueue(msg("intl:suppressed", to=sent_to))
    delivery_ = await store.get(result.id)
    assert delivery_ is not None
    assert await store.suppressed_among([delivery_]) == {result.id: "hard_bounce"}
    (entry,) = await store.list_suppressions(sent_to)
    assert entry.address == "anna@xn--e1afmkfd.xn--p1ai"  # one spelling kept
    assert not await store.suppress(sent_to, "*", "complaint")  # the same entry
    assert await store.unsuppress(sent_to) == 1
    assert await store.suppressed_among([delivery_]) == {}


async def test_a_bounce_naming_the_punycode_form_suppresses_the_unicode_recipient(
        store: Store) -> None:
    from postlane.core.records import ProviderEvent

    first = await store.enqueue(msg("intl:a", to="anna@пример.рф"))
    second = await store.enqueue(msg("intl:b", to="Anna@Пример.рф"))
    await store.suppress("anna@xn--e1afmkfd.xn--p1ai", "*", "hard_bounce")
    await store.record_provider_event(ProviderEvent(
        "sandbox", "e1", "bounced", None, recipient="anna@xn--e1afmkfd.xn--p1ai"))
    deliveries = [d for d in [await store.get(first.id), await store.get(second.id)] if d]
    assert set(await store.suppressed_among(deliveries)) == {first.id, second.id}
