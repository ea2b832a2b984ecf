"""One-click unsubscribe: the token, the configuration, and every adapter carrying the pair."""

from __future__ import annotations

import json
from dataclasses import replace
from email import message_from_bytes
from email.policy import default
from typing import Any

import boto3
import pytest

from postlane.api.access_log import redact_target
from postlane.core.lanes import DEFAULT_LANES, parse_lane_shares, with_bulk_lanes
from postlane.core.message import Delivery
from postlane.core.unsubscribe import (
    InvalidToken,
    UnsubscribeConfig,
    check_base_url,
    parse_secrets,
    sign,
    token_in_subject,
    verify,
)
from postlane.errors import ConfigurationError
from postlane.providers.http import generic_payload
from postlane.providers.mime import build_email
from postlane.providers.postmark import postmark_payload
from postlane.providers.resend import resend_payload
from postlane.providers.sandbox import SandboxConfig, SandboxProvider
from postlane.providers.ses import SESConfig, SESProvider
from tests.factories import delivery as make_delivery

SECRET = b"0123456789abcdef0123456789abcdef"
CONFIG = UnsubscribeConfig((SECRET,), "https://mail.example.com", "unsubscribe@example.com")


def bulk_delivery(**changes: Any) -> Delivery:
    plain = make_delivery("digest:7", lane="bulk", recipient="Ada@Example.com", **changes)
    return replace(plain, unsubscribe=CONFIG.for_recipient(plain.recipient, "bulk", plain.id))


# -- the token ---------------------------------------------------------------------------
def test_a_token_names_recipient_stream_and_delivery() -> None:
    token = sign(SECRET, "Ada@Example.com", "bulk", 7)
    claims = verify((SECRET,), token)
    assert (claims.address, claims.stream, claims.delivery_id) == ("ada@example.com", "bulk", 7)
    assert sign(SECRET, "ada@example.com", "bulk", 7) == token  # the same every attempt


@pytest.mark.parametrize("change", ["payload", "signature", "secret", "shape"])
def test_a_token_that_was_not_signed_here_is_refused(change: str) -> None:
    token = sign(SECRET, "ada@example.com", "bulk", 7)
    payload, _, signature = token.partition(".")
    forged = {
        "payload": sign(SECRET, "eve@example.com", "bulk", 7).split(".")[0] + "." + signature,
        "signature": f"{payload}.{signature[:-2]}AA",
        "secret": sign(b"another-secret-of-32-bytes-length", "ada@example.com", "bulk", 7),
        "shape": payload,
    }[change]
    with pytest.raises(InvalidToken):
        verify((SECRET,), forged)


def test_during_a_rotation_the_new_secret_signs_and_both_verify() -> None:
    old = sign(SECRET, "ada@example.com", "bulk", 1)
    new_secret = b"the-new-secret-0123456789abcdef!"
    rotating = UnsubscribeConfig((new_secret, SECRET), "https://mail.example.com")
    assert rotating.verify(old).address == "ada@example.com"
    assert rotating.token("ada@example.com", "bulk", 1) == sign(new_secret, "ada@example.com",
                                                                "bulk", 1)


@pytest.mark.parametrize(("raw", "problem"), [
    ("short", "at least 16 bytes"), ("", "needs a signing secret"),
])
def test_a_weak_or_missing_secret_is_a_configuration_error(raw: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        UnsubscribeConfig(parse_secrets(raw), "https://mail.example.com")


@pytest.mark.parametrize(("url", "ok"), [
    ("https://mail.example.com", True), ("https://mail.example.com/pl/", True),
    ("http://127.0.0.1:8080", True), ("http://localhost:8080", True),
    ("http://mail.example.com", False), ("ftp://mail.example.com", False),
    ("https://mail.example.com/?a=1", False), ("mail.example.com", False),
])
def test_links_are_https_except_on_loopback(url: str, ok: bool) -> None:
    if ok:
        assert not check_base_url(url).endswith("/")
    else:
        with pytest.raises(ConfigurationError):
            check_base_url(url)


def test_without_a_url_nothing_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POSTLANE_UNSUBSCRIBE_URL", raising=False)
    assert UnsubscribeConfig.from_env() is None
    monkeypatch.setenv("POSTLANE_UNSUBSCRIBE_URL", "https://mail.example.com")
    monkeypatch.setenv("POSTLANE_UNSUBSCRIBE_SECRET", SECRET.decode())
    monkeypatch.setenv("POSTLANE_UNSUBSCRIBE_MAILTO", "u@example.com")
    config = UnsubscribeConfig.from_env(exempt_templates=["legal"])
    assert config is not None and config.mailbox == "u@example.com"
    assert config.applies(True, "digest") and not config.applies(True, "legal")
    assert not config.applies(False, None)  # a transactional lane never


def test_the_mailto_subject_gives_the_token_back() -> None:
    headers = bulk_delivery().unsubscribe.headers()  # type: ignore[union-attr]
    mailto = headers["List-Unsubscribe"].split(", ")[1].strip("<>")
    subject = mailto.split("subject=")[1].replace("%20", " ")
    token = token_in_subject(f"Re: {subject}")
    assert token is not None and CONFIG.verify(token).stream == "bulk"
    assert token_in_subject("hello there") is None


def test_lanes_are_bulk_by_name_or_by_option() -> None:
    assert [lane.bulk for lane in DEFAULT_LANES] == [False, True]
    assert [lane.bulk for lane in parse_lane_shares("interactive=60,bulk=30,news=10")] == [
        False, True, False]
    lanes = with_bulk_lanes(parse_lane_shares("interactive=60,bulk=30,news=10"), "news,bulk")
    assert [lane.bulk for lane in lanes] == [False, True, True]
    assert not any(lane.bulk for lane in with_bulk_lanes(DEFAULT_LANES, ""))
    with pytest.raises(ConfigurationError, match="not a configured lane"):
        with_bulk_lanes(DEFAULT_LANES, "newsletter")


# -- every adapter carries the pair -------------------------------------------------------
def _pair(headers: dict[str, str]) -> tuple[str, str]:
    return headers["List-Unsubscribe"], headers["List-Unsubscribe-Post"]


def test_every_adapter_puts_the_pair_on_the_wire() -> None:
    delivery = bulk_delivery()
    expected = _pair(delivery.unsubscribe.headers())  # type: ignore[union-attr]
    assert expected[0].startswith("<https://mail.example.com/unsubscribe/")
    assert expected[1] == "List-Unsubscribe=One-Click"

    mime = message_from_bytes(build_email(delivery, "news@example.org").as_bytes(),
                              policy=default)
    assert (str(mime["List-Unsubscribe"]), str(mime["List-Unsubscribe-Post"])) == expected

    client = boto3.client("sesv2", region_name="eu-west-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    ses = SESProvider(SESConfig(region="eu-west-1", default_sender="news@example.org"),
                      client=client)
    raw = ses.request_of(delivery)["Content"]["Raw"]["Data"]
    parsed = message_from_bytes(raw, policy=default)
    assert (str(parsed["List-Unsubscribe"]), str(parsed["List-Unsubscribe-Post"])) == expected

    postmark = postmark_payload(delivery, "news@example.org", "broadcast")
    assert _pair({h["Name"]: h["Value"] for h in postmark["Headers"]}) == expected
    assert _pair(resend_payload(delivery, "news@example.org")["headers"]) == expected
    assert _pair(generic_payload(delivery, "news@example.org")["headers"]) == expected


def test_a_delivery_without_the_pair_carries_none_of_it() -> None:
    delivery = make_delivery("reset:1")
    mime = build_email(delivery, "app@example.org")
    assert "List-Unsubscribe" not in mime and "List-Unsubscribe-Post" not in mime
    assert "List-Unsubscribe" not in generic_payload(delivery, None)["headers"]
    assert not [h for h in postmark_payload(delivery, None)["Headers"]
                if h["Name"].startswith("List-")]


async def test_the_in_process_sandbox_keeps_what_a_bulk_message_carried() -> None:
    sandbox = SandboxProvider(SandboxConfig(seed=1))
    await sandbox.send(bulk_delivery())
    await sandbox.send(make_delivery("reset:1"))
    assert _pair(sandbox.sample_headers["bulk"])[1] == "List-Unsubscribe=One-Click"
    assert "List-Unsubscribe" not in sandbox.sample_headers["interactive"]


def test_the_access_log_never_shows_a_token_or_a_webhook_secret() -> None:
    token = sign(SECRET, "ada@example.com", "bulk", 7)
    line = f'POST /unsubscribe/{token} HTTP/1.1'
    assert redact_target(line) == "POST /unsubscribe/*** HTTP/1.1"
    assert redact_target("/v1/webhooks/postmark?token=s3cret&x=1") == (
        "/v1/webhooks/postmark?token=***&x=1")
    assert json.dumps(redact_target("/v1/status")) == '"/v1/status"'
