"""Whatever enqueue's validation accepts, every adapter can build into a message.

Hypothesis draws messages with odd text everywhere (line breaks of every kind, NUL, lone
surrogates, control characters, zero-width and right-to-left marks, encoded-word look-alikes,
display names with quotes and commas, metadata of any depth, internationalized addresses).
When ``validate`` refuses one, there is nothing to check. When it accepts one, the MIME form
that SMTP and SES send must be bytes that parse back to the same message with no line over
998 bytes (7-bit throughout; RFC 6532 UTF-8 for SMTPUTF8), and the JSON request bodies of
the HTTP adapters (generic, Postmark, Resend) must encode as httpx encodes them. Domains go
as A-labels everywhere. An address with a Unicode local part is the one thing an adapter
may refuse, and only where its transport cannot carry it: with ``InvalidAddress`` saying so.
No network: the builders are called directly.
"""

from __future__ import annotations

import datetime as dt
import json
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from typing import Any

import httpx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from postlane.core.addresses import has_unicode_local, wire_address
from postlane.core.message import Delivery, Message
from postlane.core.states import State
from postlane.core.validation import validate
from postlane.errors import InvalidAddress, InvalidMessage
from postlane.providers.http import generic_payload
from postlane.providers.mime import KEY_HEADER, build_email
from postlane.providers.postmark import postmark_payload
from postlane.providers.resend import resend_payload

DEFAULT_SENDER = "app@example.org"

# Accepted by validation, hard for a wire format: what the builders must survive.
AWKWARD = [
    "\t", " ", "  ", "\x01", "\x1f", "\x7f", "\x80", "\u00a0", "\u200b", "\u200e", "\u202e",
    "\ufeff", "\ufffd", "\U0001f4e8", "e\u0301", "ß", "ǅ", "İ", "=?", "?=",
    "=?utf-8?q?x?=", "=?utf-8?b?eA==?=", "=?x?Q?y?=",
    '"', "\\", ",", ";", ":", "<", ">", "(", ")", "@", "=", "_", ".", "\u3000", "\U00010000",
    "x" * 100,
]
# Refused by validation: drawn now and then so that the refusals are exercised too.
REFUSED = ["\r", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
           "\u2029", "\x00", "\ud800", "\udfff"]

pieces = st.one_of(
    st.text(max_size=8),
    st.sampled_from(AWKWARD),
    st.sampled_from(AWKWARD),
    st.text(st.characters(codec="utf-8"), max_size=4),
    st.sampled_from(REFUSED),
)


def odd_text(max_pieces: int = 12) -> st.SearchStrategy[str]:
    return st.lists(pieces, max_size=max_pieces).map("".join)


local_parts = st.one_of(
    st.from_regex(r"\A[a-z0-9][a-z0-9.+_-]{0,20}[a-z0-9]\Z"),
    st.sampled_from(["o'brien", "x_y-z=1", "!#$%&'*+/=?^_`{|}~-", '"quoted local"', '"a@b"', '" "',
                     '"with\\"escape"']),
    # RFC 6531: UTF-8 beyond ASCII in atext and qtext (validation refuses the invisible).
    st.sampled_from(["почта", "анна.каренина", "用户", "山田", "فاطمة", "δοκιμή", "ada🦄",
                     "jörg.müller+news", '"ünï côdé"', "e\u0301", "a\u200bb", "ǅ", "İ"]),
    st.text(st.characters(min_codepoint=0xa0, max_codepoint=0x2fff), min_size=1, max_size=6),
)
domains = st.sampled_from(["example.com", "example.org", "sub.example.co.uk", "[192.0.2.1]",
                           "xn--bcher-kva.example", "example.com.", "bücher.de", "Bücher.DE",
                           "пример.рф", "例え.テスト", "مثال.إختبار", "☃.net", "ＡＢＣ.com"])
good_addresses = st.builds(lambda local, domain: f"{local}@{domain}", local_parts, domains)
addresses = st.one_of(good_addresses, good_addresses, good_addresses, odd_text(3))
keys = st.one_of(st.from_regex(r"\Areset:[0-9]{1,6}\Z"),
                 st.builds(lambda a, b: f"welcome:{a}:{b}", st.text(max_size=8),
                           st.sampled_from(["ключ", "📨", "a b", "=?utf-8?q?x?="])),
                 odd_text(6))
display_names = st.builds(
    lambda name, address, quoted: f'"{name}" <{address}>' if quoted else f"{name} <{address}>",
    odd_text(6), addresses, st.booleans())

header_names = st.one_of(
    st.sampled_from(["Reply-To", "List-Unsubscribe", "X-Campaign", "In-Reply-To",
                     "References", "Date", "X-Entity-Ref-ID", "Comments", "Keywords",
                     "message-id", "Bcc", "X-Postlane-Key", "Content-Type"]),
    st.from_regex(r"\AX-[A-Za-z0-9-]{1,20}\Z"),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=12),
)
header_values = st.one_of(odd_text(), display_names,
                          st.lists(display_names, min_size=1, max_size=3).map(", ".join),
                          st.text(st.sampled_from("ab "), max_size=1200))
json_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), odd_text(4))
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(odd_text(3), inner, max_size=3)),
    max_leaves=12)
metadata = st.dictionaries(odd_text(3), json_values, max_size=4)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    text = draw(st.one_of(st.none(), odd_text(40), st.text(max_size=3000)))
    html = draw(st.one_of(st.none(), odd_text(40).map(lambda t: f"<p>{t}</p>")))
    if text is None and html is None:
        text = draw(odd_text())
    return Message(
        key=draw(keys),
        to=draw(addresses),
        subject=draw(st.one_of(odd_text(), st.text(st.sampled_from("ab "), max_size=1200))),
        text=text,
        html=html,
        sender=draw(st.one_of(st.none(), addresses)),
        headers=draw(st.dictionaries(header_names, header_values, max_size=4)),
        metadata=draw(metadata),
    )


def delivery_of(message: Message) -> Delivery:
    now = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
    return Delivery(
        id=1, key=message.key, lane=message.lane, channel=message.channel,
        recipient=message.to, sender=message.sender, subject=message.subject,
        text=message.text, html=message.html, headers=dict(message.headers),
        metadata=dict(message.metadata), import_id=None, template_id=None,
        template_version=None, state=State.SENDING, attempts=0, claims=1, run_at=now,
        expires_at=None, lease_owner="w", lease_expires_at=None, attempt_started_at=now,
        provider_message_id=None, dead_reason=None, last_error=None, created_at=now,
        updated_at=now, sent_at=None, finished_at=None)


def on_the_wire(address: str) -> str:
    return wire_address(address, field="to", utf8=True, transport="")


def check_mime(delivery: Delivery, *, utf8: bool = False) -> None:
    """The bytes SMTP writes after DATA and SES sends raw: parse back to the same message.
    Without ``utf8`` every byte is 7-bit; with it (SMTPUTF8) headers are RFC 6532 UTF-8."""
    sender = delivery.sender or DEFAULT_SENDER
    data = build_email(delivery, sender, utf8=utf8).as_bytes()
    assert utf8 or data.isascii(), "8-bit data with no SMTPUTF8 or 8BITMIME to carry it"
    lines = data.split(b"\r\n")
    assert all(len(line) <= 998 for line in lines), "a line over RFC 5322's 998 bytes"
    assert b"\n" not in data.replace(b"\r\n", b""), "a bare LF on the wire"
    assert b"\r" not in data.replace(b"\r\n", b""), "a bare CR on the wire"
    parsed = message_from_bytes(data, policy=default)
    assert isinstance(parsed, EmailMessage)
    assert not parsed.defects, parsed.defects
    assert [_text(a.addr_spec) for a in parsed["To"].addresses] == [
        on_the_wire(delivery.recipient)]
    assert [_text(a.addr_spec) for a in parsed["From"].addresses] == [on_the_wire(sender)]
    # Folding may change runs of ASCII white space, nothing else.
    assert _text(str(parsed["Subject"])).split() == delivery.subject.split()
    assert _text(str(parsed[KEY_HEADER])).split() == delivery.key.split()
    for name, value in delivery.headers.items():
        found = parsed.get_all(name) or []
        assert len(found) == 1, (name, found)
        if name.lower().startswith("x-"):  # unstructured: the text itself comes back
            assert _text(str(found[0])).split() == value.split(), name
    if delivery.text is not None:
        part = parsed.get_body(("plain",))
        assert part is not None
        assert _lines(part.get_content()) == _lines(delivery.text)
    if delivery.html is not None:
        part = parsed.get_body(("html",))
        assert part is not None
        assert _lines(part.get_content()) == _lines(delivery.html)


def _text(value: str) -> str:
    """A header value as text: the bytes parser keeps RFC 6532 UTF-8 as surrogate escapes."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8")


def _lines(body: str) -> list[str]:
    """A body as lines: MIME ends every line with CRLF, whichever break the text used."""
    return body.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n").split("\n")


def check_json_payloads(delivery: Delivery, *, ascii_only: bool = True) -> None:
    """The HTTP adapters' bodies, encoded exactly as httpx encodes ``json=``; with
    ``ascii_only`` False only the generic adapter declared ``utf8=1`` can build."""
    builders = [lambda: generic_payload(delivery, DEFAULT_SENDER, utf8=True)]
    if ascii_only:
        builders += [lambda: generic_payload(delivery, DEFAULT_SENDER),
                     lambda: postmark_payload(delivery, DEFAULT_SENDER, "outbound"),
                     lambda: resend_payload(delivery, DEFAULT_SENDER)]
    for build in builders:
        payload = build()
        request = httpx.Request("POST", "https://api.example.com/send", json=payload)
        assert json.loads(request.content) == _jsonable(payload)
        addresses = [payload.get("to") or payload.get("To"), payload.get("from")
                     or payload.get("From")]
        flat = [a for item in addresses for a in (item if isinstance(item, list) else [item])]
        assert flat == [on_the_wire(delivery.recipient),
                        on_the_wire(delivery.sender or DEFAULT_SENDER)]


def check_refused_without_utf8(delivery: Delivery) -> None:
    """A Unicode local part: every transport without UTF-8 refuses it, saying so."""
    sender = delivery.sender or DEFAULT_SENDER
    for build in (lambda: build_email(delivery, sender),
                  lambda: generic_payload(delivery, DEFAULT_SENDER),
                  lambda: postmark_payload(delivery, DEFAULT_SENDER, "outbound"),
                  lambda: resend_payload(delivery, DEFAULT_SENDER)):
        try:
            build()
        except InvalidAddress as exc:
            assert "local part is not ASCII" in str(exc)
        else:
            raise AssertionError("a Unicode local part built without UTF-8")


def _jsonable(payload: dict[str, Any]) -> Any:
    return json.loads(json.dumps(payload, ensure_ascii=False))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_whatever_validation_accepts_every_adapter_can_build(message: Message) -> None:
    try:
        validate(message)
    except InvalidMessage as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    delivery = delivery_of(message)
    unicode_local = has_unicode_local(delivery.recipient) or has_unicode_local(
        delivery.sender or DEFAULT_SENDER)
    if unicode_local:
        event("accepted with a Unicode local part")
        check_refused_without_utf8(delivery)
    else:
        check_mime(delivery)
    check_mime(delivery, utf8=True)
    check_json_payloads(delivery, ascii_only=not unicode_local)
