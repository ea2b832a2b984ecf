"""Internationalized addresses adapter by adapter, without sockets: the domain goes as
A-labels everywhere; a Unicode local part goes only where the transport carries UTF-8 and is
otherwise refused as a permanent outcome, saying why and without quoting the local part.
(The SMTP conversation, with and without SMTPUTF8, is in
tests/integration/test_international_content.py.)"""

from __future__ import annotations

import json
from email import message_from_bytes
from email.policy import default
from typing import Any

import httpx
import pytest

from postlane.core.addresses import ascii_domain, has_unicode_local, wire_address
from postlane.core.outcomes import OutcomeClass
from postlane.errors import InvalidAddress
from postlane.providers.http import JsonHttpProvider, generic_payload
from postlane.providers.mime import build_email, message_id
from postlane.providers.postmark import PostmarkProvider, postmark_payload
from postlane.providers.resend import ResendProvider, resend_payload
from postlane.providers.sandbox_client import SandboxHttpProvider
from postlane.providers.ses import SESConfig, SESProvider
from tests.factories import delivery

UNICODE_LOCAL = "анна@пример.рф"
IDN = "anna@пример.рф"
IDN_WIRE = "anna@xn--e1afmkfd.xn--p1ai"


# -- the address on the wire -----------------------------------------------------------------
@pytest.mark.parametrize(("address", "wire"), [
    ("anna@пример.рф", "anna@xn--e1afmkfd.xn--p1ai"),
    ("anna@Bücher.DE", "anna@xn--bcher-kva.de"),  # no case in domains: lowered first
    ("anna@bücher.example.com", "anna@xn--bcher-kva.example.com"),
    ("anna@example.com", "anna@example.com"),
    ("anna@Example.COM", "anna@Example.COM"),  # an ASCII address goes exactly as given
    ("anna@[192.0.2.1]", "anna@[192.0.2.1]"),
    ('"a b"@例え.テスト', '"a b"@xn--r8jz45g.xn--zckzah'),
])
def test_the_domain_goes_as_alabels(address: str, wire: str) -> None:
    assert wire_address(address, field="to", utf8=False, transport="x") == wire
    assert wire_address(address, field="to", utf8=True, transport="x") == wire


def test_a_unicode_local_part_is_kept_with_utf8_and_refused_without() -> None:
    assert wire_address(UNICODE_LOCAL, field="to", utf8=True, transport="x") == (
        "анна@xn--e1afmkfd.xn--p1ai")
    with pytest.raises(InvalidAddress) as info:
        wire_address(UNICODE_LOCAL, field="to", utf8=False, transport="the pigeon has no UTF-8")
    assert info.value.field == "to"
    assert "local part is not ASCII" in str(info.value)
    assert "the pigeon has no UTF-8" in str(info.value)
    assert "анна" not in str(info.value)  # no address in what ends up in logs


def test_an_invalid_domain_names_itself_and_the_rule() -> None:
    with pytest.raises(InvalidAddress, match="IDNA 2008"):
        ascii_domain("☃.net")


def test_has_unicode_local() -> None:
    assert has_unicode_local(UNICODE_LOCAL)
    assert not has_unicode_local(IDN)
    assert has_unicode_local('"ü"@example.com')


def test_the_message_id_has_the_senders_domain_in_alabels() -> None:
    assert message_id("k", "app@bücher.de").endswith("@xn--bcher-kva.de>")
    assert message_id("k", "app@bücher.de") == message_id("k", "app@xn--bcher-kva.de")
    assert message_id("k", "app@☃.net").endswith("@postlane>")  # never raises


# -- MIME (SMTP, SES) --------------------------------------------------------------------------
def test_without_utf8_the_mime_message_is_7bit_with_alabels() -> None:
    item = delivery(recipient=IDN, sender="app@bücher.de", subject="Привет, мир 👋",
                    text="Здравствуйте 👋\n", html="<p>你好</p>")
    data = build_email(item, "app@bücher.de").as_bytes()
    assert data.isascii()
    parsed = message_from_bytes(data, policy=default)
    assert str(parsed["To"]) == IDN_WIRE
    assert str(parsed["From"]) == "app@xn--bcher-kva.de"
    assert str(parsed["Subject"]) == "Привет, мир 👋"
    assert b"Content-Transfer-Encoding: 8bit" not in data


def test_without_utf8_a_unicode_local_part_cannot_be_built() -> None:
    with pytest.raises(InvalidAddress, match="local part is not ASCII"):
        build_email(delivery(recipient=UNICODE_LOCAL), "app@example.org")
    with pytest.raises(InvalidAddress, match="local part is not ASCII") as info:
        build_email(delivery(), "приложение@example.org")
    assert info.value.field == "sender"


def test_with_utf8_the_mime_message_is_rfc_6532() -> None:
    item = delivery(recipient=UNICODE_LOCAL, subject="Привет")
    data = build_email(item, "app@example.org", utf8=True).as_bytes()
    assert "To: анна@xn--e1afmkfd.xn--p1ai\r\n".encode() in data
    assert "Subject: Привет\r\n".encode() in data


# -- SES ---------------------------------------------------------------------------------------
def test_ses_sends_alabels_and_refuses_a_unicode_local_part() -> None:
    ses = SESProvider(SESConfig(region="eu-west-1"), client=object())  # type: ignore[arg-type]
    request = ses.request_of(delivery(recipient=IDN, sender="app@bücher.de"))
    assert request["Destination"] == {"ToAddresses": [IDN_WIRE]}
    assert request["FromEmailAddress"] == "app@xn--bcher-kva.de"
    with pytest.raises(InvalidAddress, match="Amazon SES does not support SMTPUTF8"):
        ses.request_of(delivery(recipient=UNICODE_LOCAL))


async def test_ses_send_is_permanent_for_a_unicode_local_part_and_calls_nothing() -> None:
    ses = SESProvider(SESConfig(region="eu-west-1"), client=object())  # type: ignore[arg-type]
    outcome = await ses.send(delivery(recipient=UNICODE_LOCAL))
    assert outcome.kind is OutcomeClass.PERMANENT
    assert "refused before sending" in (outcome.response or "")


# -- the JSON APIs -----------------------------------------------------------------------------
@pytest.mark.parametrize(("build", "to_field", "from_field"), [
    (lambda d: generic_payload(d, None), "to", "from"),
    (lambda d: postmark_payload(d, None), "To", "From"),
    (lambda d: resend_payload(d, None), "to", "from"),
], ids=["generic", "postmark", "resend"])
def test_json_apis_send_alabels(build: Any, to_field: str, from_field: str) -> None:
    body = build(delivery(recipient=IDN, sender="app@bücher.de"))
    to = body[to_field]
    assert (to if isinstance(to, str) else to[0]) == IDN_WIRE
    assert body[from_field] == "app@xn--bcher-kva.de"


@pytest.mark.parametrize(("build", "why"), [
    (lambda d: generic_payload(d, None), "utf8=1"),
    (lambda d: postmark_payload(d, None), "Postmark does not accept Unicode mailbox names"),
    (lambda d: resend_payload(d, None), "Resend does not document"),
], ids=["generic", "postmark", "resend"])
def test_json_apis_refuse_a_unicode_local_part_saying_why(build: Any, why: str) -> None:
    with pytest.raises(InvalidAddress, match="local part is not ASCII") as info:
        build(delivery(recipient=UNICODE_LOCAL))
    assert why in str(info.value)


async def _send(provider: Any, item: Any) -> tuple[OutcomeClass, str, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "m-1", "ErrorCode": 0, "MessageID": "m-1"})

    provider._transport = httpx.MockTransport(record)
    await provider.open()
    try:
        outcome = await provider.send(item)
    finally:
        await provider.close()
    return outcome.kind, outcome.response or "", seen


@pytest.mark.parametrize("url", ["https://api.example.com/send?from=app@example.org",
                                 "postmark://:token@?from=app@example.org",
                                 "resend://:key@?from=app@example.org"])
async def test_a_refused_unicode_local_part_is_permanent_and_nothing_is_requested(
        url: str) -> None:
    provider: Any = (JsonHttpProvider.from_url(url) if url.startswith("https")
                     else PostmarkProvider.from_url(url) if url.startswith("postmark")
                     else ResendProvider.from_url(url))
    kind, response, seen = await _send(provider, delivery(recipient=UNICODE_LOCAL))
    assert kind is OutcomeClass.PERMANENT
    assert response.startswith("refused before sending: to: the local part is not ASCII")
    assert seen == []


async def test_the_generic_api_declared_utf8_sends_a_unicode_local_part() -> None:
    provider = JsonHttpProvider.from_url("https://api.example.com/send?utf8=1")
    assert provider.utf8
    kind, _, seen = await _send(provider, delivery(recipient=UNICODE_LOCAL))
    assert kind is OutcomeClass.ACCEPTED
    (request,) = seen
    assert json.loads(request.content)["to"] == "анна@xn--e1afmkfd.xn--p1ai"
    assert not JsonHttpProvider.from_url("https://api.example.com/send").utf8


async def test_the_sandbox_takes_a_unicode_local_part() -> None:
    provider = SandboxHttpProvider.from_url("sandbox+http://127.0.0.1:9")
    kind, _, seen = await _send(provider, delivery(recipient=UNICODE_LOCAL))
    assert kind is OutcomeClass.ACCEPTED
    (request,) = seen
    assert json.loads(request.content)["to"] == "анна@xn--e1afmkfd.xn--p1ai"
