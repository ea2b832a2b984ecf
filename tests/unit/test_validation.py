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
    Limits,
    Message,
    PostlaneError,
    UnknownLane,
)
from postlane.core.validation import (
    MAX_KEY_LENGTH,
    check_address,
    check_header,
    check_key,
    redact_address,
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
        "user@example.com.",  # a fully qualified name with its root dot
        "a" * 64 + "@example.com",
        "user@" + ".".join(["a" * 63] * 3) + ".com",
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
        ("alice@bücher.de", "not a valid host name"),
        ("alice@example.123", "numeric top-level label"),
        ("alice@192.168.0.1", "numeric top-level label"),
        ("Alice <alice@example.com>", "whitespace"),
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
@pytest.mark.parametrize("value", ["a\r\nBcc: x@example.com", "a\nb", "a\rb", "a\0b"])
def test_header_value_with_cr_lf_nul_is_refused(value: str) -> None:
    with pytest.raises(InvalidHeader, match="CR, LF or NUL"):
        check_header("X-Tag", value)
    with pytest.raises(InvalidHeader):
        validate(message(headers={"X-Tag": value}))


@pytest.mark.parametrize("name", ["", "X Tag", "X:Tag", "X-Tag\r\n", "Ünïcode", "X\tTag"])
def test_bad_header_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidHeader, match="printable ASCII"):
        check_header(name, "v")


def test_good_headers_pass() -> None:
    check_header("List-Unsubscribe", "<mailto:u@example.com>, <https://example.com/u?a=1>")
    check_header("X-Entity-Ref-ID", "")
    validate(message(headers={"Reply-To": "support@example.com", "X-Campaign": "spring"}))


@pytest.mark.parametrize("subject", ["Hi\r\nBcc: x@example.com", "Hi\nthere", "Hi\r"])
def test_subject_with_cr_lf_is_refused(subject: str) -> None:
    with pytest.raises(InvalidHeader) as info:
        validate(message(subject=subject))
    assert info.value.field == "subject"


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
