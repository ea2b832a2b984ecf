from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from postlane import (
    ContentTooLarge,
    InvalidAddress,
    InvalidHeader,
    InvalidKey,
    InvalidMessage,
    InvalidMetadata,
    InvalidText,
    Limits,
    Message,
    PostlaneError,
    UnknownLane,
)
from postlane.core.validation import (
    LINE_BREAKS,
    MAX_KEY_LENGTH,
    MAX_METADATA_DEPTH,
    check_address,
    check_header,
    check_key,
    json_problem,
    redact_address,
    text_problem,
    validate,
)


def message(**overrides: Any) -> Message:
    fields: dict[str, Any] = {"key": "reset:42", "to": "alice@example.com",
                              "subject": "Reset", "text": "Follow the link."}
    fields.update(overrides)
    return Message(**fields)


# -- addresses ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "address",
    [
        "alice@example.com",
        "a@b.co",
        "first.last@sub.example.co.uk",
        "user+tag@example.com",
        "o'brien@example.ie",
        "x_y-z=1@example-host.com",
        "!#$%&'*+/=?^_`{|}~-@example.com",
        '"quoted local"@example.com',
        '"with\\"escape"@example.com',
        "user@[192.0.2.1]",
        "user@[IPv6:2001:db8::1]",
        "a" * 64 + "@example.com",
        "user@" + ".".join(["a" * 63] * 3) + ".com",
        # Internationalized (RFC 6531): Unicode domains (IDNA 2008) and local parts.
        "alice@bücher.de",
        "alice@Bücher.DE",  # domains have no case: lowered before IDNA
        "почта@пример.рф",
        "用户@例子.广告",
        "صندوق@مثال.إختبار",
        "δοκιμή@παράδειγμα.δοκιμή",
        "🙂@example.com",  # RFC 6532 atext: any UTF-8 beyond ASCII
        "jörg.müller+news@example.de",
        '"ünï côdé"@example.com',
        "ü" * 32 + "@example.com",  # 64 octets in UTF-8
    ],
)
def test_valid_addresses(address: str) -> None:
    check_address(address)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("", "empty"),
        ("alice", "no local part and domain"),
        ("alice@", "no local part and domain"),
        ("@example.com", "no local part and domain"),
        ("alice example@example.com", "whitespace"),
        ("alice@example.com\r\nBcc: victim@example.com", "whitespace or control"),
        ("alice\n@example.com", "whitespace or control"),
        ("alice\t@example.com", "whitespace or control"),
        ("alice\0@example.com", "whitespace or control"),
        ("a" * 65 + "@example.com", "local part is longer than 64"),
        ("x@" + "a" * 250 + ".com", "longer than 254"),
        (".alice@example.com", "local part is not valid"),
        ("alice.@example.com", "local part is not valid"),
        ("al..ice@example.com", "local part is not valid"),
        ("al(ice@example.com", "local part is not valid"),
        ('"unterminated@example.com', "local part is not valid"),
        ("alice@localhost", "not a valid host name"),
        ("alice@-example.com", "not a valid host name"),
        ("alice@example-.com", "not a valid host name"),
        ("alice@exa_mple.com", "not a valid host name"),
        ("alice@example..com", "not a valid host name"),
        ("alice@" + "a" * 64 + ".com", "not a valid host name"),
        ("alice@bücher_.de", "not a valid internationalized domain name"),
        ("alice@example.123", "numeric top-level label"),
        ("alice@192.168.0.1", "numeric top-level label"),
        ("Alice <alice@example.com>", "whitespace"),
        ("alice@example.com.", "ends with a dot"),  # the email package reads no address
        # Internationalized, but not valid.
        ("ü" * 33 + "@example.com", "local part is longer than 64"),  # 66 octets
        ("alice@☃.net", "not a valid internationalized domain name"),
        ("alice@😀.com", "not a valid internationalized domain name"),
        ("alice@ＡＢＣ.com", "not a valid internationalized domain name"),  # not folded
        ("alice@bu\u0308cher.de", "not a valid internationalized domain name"),  # not NFC
        ("alice@" + "ü" * 60 + ".de", "not a valid internationalized domain name"),
        # 253 characters as given, 260 with the domain in A-labels, as it goes on the wire.
        ("a" * 64 + "@bücher." + "b" * 63 + "." + "c" * 63 + "." + "d" * 50 + ".de",
         "longer than 254"),
        ("u\u0308ser@example.com", "not in Unicode normalization form NFC"),
        ("us\u200ber@example.com", "invisible format character"),
        ("us\u202eer@example.com", "invisible format character"),
        ("us\u00a0er@example.com", "a space"),
        ("us\u3000er@example.com", "a space"),
        ("us\u0085er@example.com", "control character"),
        ("us\ue000er@example.com", "private-use"),
        ("us\U000e0001er@example.com", "invisible format character"),
        ("jörg..müller@example.de", "local part is not valid"),
        (".jörg@example.de", "local part is not valid"),
        ("jö(rg@example.de", "local part is not valid"),
    ],
)
def test_invalid_addresses(address: str, why: str) -> None:
    with pytest.raises(InvalidAddress, match=why) as info:
        check_address(address, field="to")
    assert info.value.field == "to"
    # The class hierarchy callers rely on to catch "bad input, nothing written".
    assert isinstance(info.value, InvalidMessage)
    assert isinstance(info.value, PostlaneError)
    assert isinstance(info.value, ValueError)


def test_non_string_address_is_invalid() -> None:
    with pytest.raises(InvalidAddress, match="empty"):
        check_address(None)  # type: ignore[arg-type]


def test_sender_is_checked_too() -> None:
    validate(message(sender="noreply@example.com"))
    with pytest.raises(InvalidAddress) as info:
        validate(message(sender="noreply@"))
    assert info.value.field == "sender"


# -- headers -----------------------------------------------------------------------------
# Every character str.splitlines breaks at (what Python's email package folds at), and NUL.
BREAKS = ["\r", "\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def test_line_breaks_are_exactly_what_splitlines_breaks_at() -> None:
    assert set(LINE_BREAKS) == set(BREAKS)
    assert {chr(c) for c in range(0x110000)
            if len(f"a{chr(c)}b".splitlines()) > 1} == set(LINE_BREAKS)


@pytest.mark.parametrize("value", ["a\r\nBcc: x@example.com", "a\0b"]
                         + [f"a{c}Bcc: x@example.com" for c in BREAKS])
def test_header_value_with_a_line_break_or_nul_is_refused(value: str) -> None:
    with pytest.raises(InvalidHeader, match="line break"):
        check_header("X-Tag", value)
    with pytest.raises(InvalidHeader):
        validate(message(headers={"X-Tag": value}))


@pytest.mark.parametrize("name", ["List-Unsubscribe", "list-unsubscribe-post"])
def test_the_unsubscribe_pair_is_the_pipelines(name: str) -> None:
    """Only bulk lanes carry it, with a token only Postlane can sign (docs/deliverability.md)."""
    with pytest.raises(InvalidHeader, match="bulk lanes"):
        check_header(name, "<mailto:u@example.com>")


@pytest.mark.parametrize("name", ["", "X Tag", "X:Tag", "X-Tag\r\n", "Ünïcode", "X\tTag"])
def test_bad_header_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidHeader, match="printable ASCII"):
        check_header(name, "v")


def test_good_headers_pass() -> None:
    check_header("References", "<a@example.com> <b@example.com>")
    check_header("X-Entity-Ref-ID", "")
    validate(message(headers={"Reply-To": "support@example.com", "X-Campaign": "spring"}))


@pytest.mark.parametrize("subject", ["Hi\r\nBcc: x@example.com", "Hi\nthere", "Hi\r"]
                         + [f"Hi{c}Bcc: x@example.com" for c in BREAKS])
def test_subject_with_a_line_break_is_refused(subject: str) -> None:
    with pytest.raises(InvalidHeader, match="line break") as info:
        validate(message(subject=subject))
    assert info.value.field == "subject"


@pytest.mark.parametrize("name", ["Message-ID", "message-id", "Content-Type", "MIME-Version",
                                  "Content-Transfer-Encoding", "X-Postlane-Key",
                                  "x-postlane-anything"])
def test_headers_the_pipeline_sets_are_refused(name: str) -> None:
    with pytest.raises(InvalidHeader, match="set by Postlane") as info:
        validate(message(headers={name: "x"}))
    assert info.value.field == "headers"


@pytest.mark.parametrize(("name", "owner"), [
    ("To", "to"), ("CC", "to"), ("bcc", "to"), ("From", "sender"), ("Sender", "sender"),
    ("Subject", "subject"),
])
def test_headers_a_field_owns_are_refused(name: str, owner: str) -> None:
    with pytest.raises(InvalidHeader, match=f"the message's '{owner}' field"):
        validate(message(headers={name: "victim@example.com"}))


@pytest.mark.parametrize("brk", BREAKS)
@pytest.mark.parametrize("field", ["to", "sender"])
def test_addresses_with_any_line_break_are_refused(field: str, brk: str) -> None:
    with pytest.raises(InvalidAddress) as info:
        validate(message(**{field: f"alice{brk}@example.com"}))
    assert info.value.field == field


def test_display_names_and_odd_unicode_in_headers_pass() -> None:
    validate(message(headers={"Reply-To": '"Zoë Ünïcode, Ph.D." <zoe@example.com>',
                              "X-Emoji": "📨 \u00a0 tab\tinside"},
                     subject="Grüße 📨 — \u200b\tand a tab"))


# -- what the database can store ---------------------------------------------------------
@pytest.mark.parametrize(("field", "bad", "why"), [
    ("text", "a\0b", "NUL"), ("html", "<p>\0</p>", "NUL"), ("subject", "a\0b", "NUL"),
    ("text", "a\ud800b", "lone surrogate"), ("html", "\udfff", "lone surrogate"),
    ("subject", "\udc80", "lone surrogate"), ("import_id", "imp\0", "NUL"),
    ("template_id", "t\ud83d", "lone surrogate"), ("key", "k\udc00", "lone surrogate"),
])
def test_unstorable_text_is_refused(field: str, bad: str, why: str) -> None:
    with pytest.raises(InvalidText, match=why) as info:
        validate(message(**{field: bad}))
    assert info.value.field == field
    assert isinstance(info.value, InvalidMessage)


def test_a_nul_in_a_header_value_is_refused() -> None:
    with pytest.raises(InvalidHeader, match="NUL"):
        validate(message(headers={"X-A": "a\0"}))
    with pytest.raises(InvalidText, match="lone surrogate"):
        validate(message(headers={"X-A": "a\ud800"}))


def nested(depth: int) -> dict[str, Any]:
    """Metadata ``depth`` levels deep (the object itself is level 1)."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


def test_metadata_up_to_the_depth_limit_passes_and_deeper_is_refused() -> None:
    validate(message(metadata=nested(MAX_METADATA_DEPTH)))
    validate(message(metadata={"a": [[[{"b": [1, 2.5, None, True, "x"]}]]]}))
    with pytest.raises(InvalidMetadata, match=f"deeper than {MAX_METADATA_DEPTH} levels"):
        validate(message(metadata=nested(MAX_METADATA_DEPTH + 1)))
    # Far past where recursion (hashing, encoding) would fail: refused, not RecursionError.
    with pytest.raises(InvalidMetadata, match="deeper than"):
        validate(message(metadata=nested(100_000)))


@pytest.mark.parametrize(("metadata", "why"), [
    ({"a": "x\0"}, "a contains a NUL"),
    ({"a": ["ok", "\ud800"]}, r"a\[1\] is not valid Unicode"),
    ({"a\0": 1}, "a key contains a NUL"),
    ({1: "x"}, "key 1 is not a string"),
    ({"a": float("nan")}, "NaN and infinity"),
    ({"a": {"b": float("-inf")}}, "a.b: NaN and infinity"),
    ({"a": datetime(2030, 1, 1)}, "a datetime is not JSON"),
    ({"a": {1, 2}}, "a set is not JSON"),
])
def test_metadata_that_is_not_storable_json_is_refused(metadata: Any, why: str) -> None:
    with pytest.raises(InvalidMetadata, match=why) as info:
        validate(message(metadata=metadata))
    assert info.value.field == "metadata"


def test_text_problem_names_the_problem() -> None:
    assert text_problem("fine ✓ 📨") is None
    assert text_problem("a\0") == "contains a NUL character"
    assert text_problem("\ud800") == "is not valid Unicode (a lone surrogate)"
    assert json_problem({"ok": [1, "two", {"three": None}]}) is None


# -- keys --------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["reset:1", "welcome:user-7:import-3", "k" * MAX_KEY_LENGTH,
                                 "ключ:1", "a b"])
def test_good_keys(key: str) -> None:
    check_key(key)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("k" * (MAX_KEY_LENGTH + 1), "longer than 255"),
        ("reset:\n1", "control characters"),
        ("reset:\x001", "control characters"),
        ("reset:\x7f", "control characters"),
        ("\ttab", "control characters"),
        ("reset:\x850", "control characters"),  # NEL: the key travels in a header
        ("reset:\u20281", "control characters"),
        ("reset:\x9f", "control characters"),
    ],
)
def test_bad_keys(key: str, why: str) -> None:
    with pytest.raises(InvalidKey, match=why) as info:
        check_key(key)
    assert info.value.field == "key"
    with pytest.raises(InvalidKey):
        validate(message(key=key))


# -- lanes, bodies, channels, size -------------------------------------------------------
def test_unknown_lane() -> None:
    with pytest.raises(UnknownLane, match=r"'marketing'.*bulk, interactive") as info:
        validate(message(lane="marketing"))
    assert info.value.field == "lane"
    validate(message(lane="bulk"))
    validate(message(lane="marketing"), Limits(lanes=("marketing",)))
    with pytest.raises(UnknownLane):
        validate(message(lane="interactive"), Limits(lanes=("marketing",)))


def test_email_needs_a_body() -> None:
    with pytest.raises(InvalidMessage, match="text or an html body"):
        validate(message(text=None, html=None))
    validate(message(text=None, html="<p>hi</p>"))


def test_unknown_channel() -> None:
    with pytest.raises(InvalidMessage, match="unknown channel") as info:
        validate(message(channel="pigeon"))
    assert info.value.field == "channel"


def test_content_size_limit_is_in_utf8_bytes() -> None:
    limits = Limits(max_content_bytes=100)
    validate(message(subject="", text="x" * 100), limits)
    with pytest.raises(ContentTooLarge, match="101 bytes, over the limit of 100"):
        validate(message(subject="", text="x" * 101), limits)
    # 50 two-byte characters are 100 bytes; one more byte is over.
    validate(message(subject="", text="é" * 50), limits)
    with pytest.raises(ContentTooLarge):
        validate(message(subject="!", text="é" * 50), limits)


def test_content_size_counts_subject_html_and_headers() -> None:
    m = message(subject="abc", text="de", html="<p>", headers={"X-A": "1"})
    assert m.content_size() == 3 + 2 + 3 + len("X-A: 1")


def test_default_size_limit() -> None:
    validate(message(subject="", text="x" * 1_000_000))
    with pytest.raises(ContentTooLarge):
        validate(message(subject="", text="x" * 1_000_001))


# -- sms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("number", ["+4915112345678", "+12025550123", "+3312345"])
def test_sms_e164_valid(number: str) -> None:
    validate(message(channel="sms", to=number, subject=""))


@pytest.mark.parametrize(
    "number", ["4915112345678", "+0123456789", "+49 151 1234567", "+1234", "+1234567890123456",
               "alice@example.com", "+49151-1234567", ""],
)
def test_sms_e164_invalid(number: str) -> None:
    with pytest.raises(InvalidAddress, match=r"E\.164") as info:
        validate(message(channel="sms", to=number))
    assert info.value.field == "to"


def test_sms_needs_text() -> None:
    with pytest.raises(InvalidMessage, match="SMS needs a text"):
        validate(message(channel="sms", to="+4915112345678", text=None, html="<p>"))


# -- expiry and delay --------------------------------------------------------------------
def test_expires_at_must_be_timezone_aware() -> None:
    naive = datetime(2030, 1, 1, 12, 0)
    with pytest.raises(InvalidMessage, match="timezone-aware") as info:
        validate(message(expires_at=naive))
    assert info.value.field == "expires_at"
    validate(message(expires_at=naive.replace(tzinfo=UTC)))


def test_expires_at_and_expires_in_are_exclusive() -> None:
    with pytest.raises(InvalidMessage, match="not both"):
        validate(message(expires_at=datetime.now(UTC), expires_in=timedelta(minutes=15)))


@pytest.mark.parametrize("window", [timedelta(0), timedelta(seconds=-1)])
def test_expires_in_must_be_positive(window: timedelta) -> None:
    with pytest.raises(InvalidMessage, match="expires_in must be positive"):
        validate(message(expires_in=window))


def test_delay_must_not_be_negative() -> None:
    validate(message(delay=timedelta(0)))
    with pytest.raises(InvalidMessage, match="delay must not be negative"):
        validate(message(delay=timedelta(seconds=-1)))


def test_first_problem_wins_key_before_address() -> None:
    with pytest.raises(InvalidKey):
        validate(message(key="", to="not-an-address"))


# -- redaction ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "redacted"),
    [
        ("alice@example.com", "a***@example.com"),
        ("a@example.com", "a***@example.com"),
        ("@example.com", "***@example.com"),
        ("weird@local@example.com", "w***@example.com"),
        ("abc", "***"),
        ("abcdef", "ab***"),
        ("+4915112345678", "+4***"),
    ],
)
def test_redact_address(address: str, redacted: str) -> None:
    assert redact_address(address) == redacted
    local = address.rpartition("@")[0]
    if len(local) > 1:
        assert local not in redact_address(address)
