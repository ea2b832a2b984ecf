"""The normalised event model: each provider's events mapped row by row, bounces over SMTP
parsed with the stdlib email package, and what each kind does to the suppression list."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postlane.core.deliverability import (
    SuppressionPolicy,
    SuppressionRule,
    suppression_for,
    unsubscribe_event,
)
from postlane.core.records import EVENT_KINDS, ProviderEvent
from postlane.core.unsubscribe import TokenClaims, sign
from postlane.errors import ConfigurationError
from postlane.webhooks import _parse_ses, _parse_standard, parse_postmark
from postlane.webhooks.dsn import classify, parse_inbound


def event(kind: str) -> ProviderEvent:
    return ProviderEvent("test", "e1", kind, "m1", "ada@example.com")


# -- what each kind suppresses -----------------------------------------------------------------
@pytest.mark.parametrize(("kind", "soft", "rule"), [
    ("bounced", 0, SuppressionRule("*", "hard bounce")),
    ("complained", 0, SuppressionRule("bulk", "complaint")),
    ("unsubscribed", 0, SuppressionRule("bulk", "unsubscribed")),
    ("soft_bounced", 2, None),
    ("soft_bounced", 3, SuppressionRule("*", "3 soft bounces", timedelta(days=7))),
    ("soft_bounced", 5, SuppressionRule("*", "5 soft bounces", timedelta(days=7))),
    ("deferred", 9, None), ("delivered", 0, None), ("rejected", 0, None),
    ("opened", 0, None), ("clicked", 0, None),
])
def test_suppression_rules(kind: str, soft: int, rule: SuppressionRule | None) -> None:
    assert kind in EVENT_KINDS
    assert suppression_for(event(kind), "bulk", soft_bounces=soft) == rule


def test_a_stream_scoped_event_without_a_lane_suppresses_nothing() -> None:
    assert suppression_for(event("complained"), None) is None
    assert suppression_for(event("bounced"), None) == SuppressionRule("*", "hard bounce")


def test_the_soft_bounce_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SuppressionPolicy.from_env() == SuppressionPolicy()
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_THRESHOLD", "0")
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_WINDOW", "2d")
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_SUPPRESS_FOR", "12h")
    policy = SuppressionPolicy.from_env()
    assert policy == SuppressionPolicy(0, timedelta(days=2), timedelta(hours=12))
    assert suppression_for(event("soft_bounced"), "bulk", soft_bounces=99, policy=policy) is None
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_THRESHOLD", "three")
    with pytest.raises(ConfigurationError, match="whole number"):
        SuppressionPolicy.from_env()
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_THRESHOLD", "3")
    monkeypatch.setenv("POSTLANE_SOFT_BOUNCE_WINDOW", "a week")
    with pytest.raises(ConfigurationError, match="POSTLANE_SOFT_BOUNCE_WINDOW"):
        SuppressionPolicy.from_env()
    with pytest.raises(ConfigurationError, match="positive"):
        SuppressionPolicy(3, timedelta(0))


def test_an_unsubscribe_is_one_event_per_recipient_stream_and_delivery() -> None:
    first = unsubscribe_event(TokenClaims("ada@example.com", "bulk", 7), via="one-click")
    again = unsubscribe_event(TokenClaims("ada@example.com", "bulk", 7), via="mailto")
    assert first.event_id == again.event_id == "unsubscribe:bulk:7"
    assert (first.kind, first.lane, first.delivery_id) == ("unsubscribed", "bulk", 7)
    unknown = unsubscribe_event(TokenClaims("ada@example.com", "bulk", None), via="mailto")
    assert unknown.event_id.startswith("unsubscribe:bulk:") and "ada" not in unknown.event_id


# -- Postmark --------------------------------------------------------------------------------
def bounce(kind: str, **extra: Any) -> dict[str, Any]:
    return {"RecordType": "Bounce", "ID": 4323372036854775807, "Type": kind, "TypeCode": 1,
            "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483", "Email": "john@example.com",
            "MessageStream": "outbound", **extra}


@pytest.mark.parametrize(("payload", "kind"), [
    (bounce("HardBounce"), "bounced"),
    (bounce("BadEmailAddress"), "bounced"),
    (bounce("SoftBounce"), "soft_bounced"),
    (bounce("Transient"), "soft_bounced"),
    (bounce("DnsError"), "soft_bounced"),
    (bounce("Unsubscribe"), "unsubscribed"),
    (bounce("Blocked"), "rejected"),
    (bounce("DMARCPolicy"), "rejected"),
    (bounce("AutoResponder"), None),
    (bounce("AddressChange"), None),
    ({"RecordType": "SpamComplaint", "ID": 1, "Type": "SpamComplaint", "MessageID": "m",
      "Email": "john@example.com"}, "complained"),
    ({"RecordType": "Delivery", "MessageID": "m", "Recipient": "john@example.com",
      "DeliveredAt": "2019-11-05T16:33:54Z", "Details": "250 OK"}, "delivered"),
    ({"RecordType": "SubscriptionChange", "MessageID": "m", "Recipient": "john@example.com",
      "SuppressSending": True, "SuppressionReason": "ManualSuppression",
      "ChangedAt": "2020-02-01T10:53:34Z", "Origin": "Recipient"}, "unsubscribed"),
    ({"RecordType": "SubscriptionChange", "MessageID": "m", "Recipient": "john@example.com",
      "SuppressSending": False, "SuppressionReason": None,
      "ChangedAt": "2020-02-01T10:53:34Z"}, None),
    ({"RecordType": "Open", "MessageID": "m", "Recipient": "john@example.com",
      "ReceivedAt": "2019-11-05T16:33:54Z"}, "opened"),
    ({"RecordType": "Click", "MessageID": "m", "Recipient": "john@example.com",
      "ReceivedAt": "2019-11-05T16:33:54Z"}, "clicked"),
    ({"RecordType": "Inbound", "MessageID": "m"}, None),
])
def test_postmark_table(payload: dict[str, Any], kind: str | None) -> None:
    parsed = parse_postmark(payload)
    assert (parsed.kind if parsed else None) == kind
    if parsed is not None:
        assert parsed.provider == "postmark" and parsed.provider_message_id == payload[
            "MessageID"]
        assert parsed.recipient == "john@example.com"


def test_postmark_event_ids_tell_apart_events_of_one_message() -> None:
    ids = {parse_postmark(p).event_id for p in (  # type: ignore[union-attr]
        bounce("HardBounce", ID=1), bounce("HardBounce", ID=2),
        {"RecordType": "Delivery", "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
         "Recipient": "john@example.com"})}
    assert len(ids) == 3


# -- SES, Resend, the sandbox --------------------------------------------------------------------
def ses(kind: str, **body: Any) -> str:
    return json.dumps({"eventType": kind, "mail": {"messageId": "ses-1",
                                                   "destination": ["ada@example.com"]}, **body})


@pytest.mark.parametrize(("message", "kind"), [
    (ses("Bounce", bounce={"bounceType": "Permanent"}), "bounced"),
    (ses("Bounce", bounce={"bounceType": "Transient"}), "soft_bounced"),
    (ses("Bounce", bounce={"bounceType": "Undetermined"}), "soft_bounced"),
    (ses("Complaint"), "complained"), (ses("Delivery"), "delivered"),
    (ses("DeliveryDelay"), "deferred"), (ses("Reject"), "rejected"),
    (ses("Rendering Failure"), "rejected"),
    (ses("Subscription", subscription={"newTopicPreferences": {"unsubscribeAll": True}}),
     "unsubscribed"),
    (ses("Subscription", subscription={"newTopicPreferences": {"unsubscribeAll": False}}),
     None),
    (ses("Send"), None),
])
def test_ses_table(message: str, kind: str | None) -> None:
    parsed = _parse_ses("sns-1", message)
    assert (parsed.kind if parsed else None) == kind


@pytest.mark.parametrize(("payload", "kind"), [
    ({"type": "email.bounced", "data": {"email_id": "r1", "to": ["a@x.io"],
                                        "bounce": {"type": "Permanent"}}}, "bounced"),
    ({"type": "email.bounced", "data": {"email_id": "r1", "to": ["a@x.io"],
                                        "bounce": {"type": "Transient"}}}, "soft_bounced"),
    ({"type": "email.bounced", "data": {"message_id": "s1", "to": "a@x.io",
                                        "bounce_type": "soft"}}, "soft_bounced"),
    ({"type": "email.complained", "data": {"email_id": "r1", "to": ["a@x.io"]}}, "complained"),
    ({"type": "email.delivery_delayed", "data": {"email_id": "r1"}}, "deferred"),
    ({"type": "email.failed", "data": {"email_id": "r1"}}, "rejected"),
    ({"type": "email.sent", "data": {"email_id": "r1"}}, None),
])
def test_resend_and_sandbox_table(payload: dict[str, Any], kind: str | None) -> None:
    parsed = _parse_standard("resend", "evt", json.dumps(payload).encode())
    assert (parsed.kind if parsed else None) == kind


# -- SMTP: DSNs, feedback reports, mailto unsubscribes ------------------------------------------
@pytest.mark.parametrize(("action", "status", "kind"), [
    ("failed", "5.1.1", "bounced"), ("failed", "5.7.1 (refused)", "bounced"),
    ("failed", "5.2.2", "soft_bounced"), ("failed", "4.4.7", "soft_bounced"),
    ("Failed", "", "bounced"), ("delayed", "4.4.1", "deferred"),
    ("delivered", "2.0.0", "delivered"), ("relayed", "2.0.0", "delivered"),
    ("expanded", "2.0.0", "delivered"), ("something", "5.0.0", None),
])
def test_dsn_action_and_status_table(action: str, status: str, kind: str | None) -> None:
    assert classify(action, status) == kind


ORIGINAL = ("Message-ID: <abc123@example.org>\r\nX-Postlane-Key: digest:7\r\n"
            "To: ada@example.com\r\nSubject: Your digest\r\n")


def report(report_type: str, second: str, third: str) -> bytes:
    return (f"From: MAILER-DAEMON@mx.example.net\r\nMessage-ID: <r1@mx>\r\nMIME-Version: 1.0"
            f"\r\nContent-Type: multipart/report; report-type={report_type}; boundary=\"B\"\r\n"
            f"\r\n--B\r\nContent-Type: text/plain\r\n\r\nSee below.\r\n--B\r\n{second}\r\n"
            f"--B\r\n{third}\r\n--B--\r\n").encode()


def test_a_dsn_with_the_returned_message_names_each_recipient() -> None:
    status = ("Content-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx\r\n\r\n"
              "Final-Recipient: rfc822; Ada@Example.com\r\nAction: failed\r\nStatus: 5.1.1\r\n"
              "Diagnostic-Code: smtp; 550 5.1.1 <ada@example.com>:\r\n  user unknown\r\n\r\n"
              "Final-Recipient: rfc822;bob@example.com\r\nAction: delayed\r\n"
              "Status: 4.4.1\r\n")
    [hard, later] = parse_inbound(report("delivery-status", status,
                                         f"Content-Type: message/rfc822\r\n\r\n{ORIGINAL}\r\n"
                                         "Body.\r\n"))
    assert (hard.kind, hard.recipient, hard.provider_message_id, hard.idempotency_key) == (
        "bounced", "ada@example.com", "<abc123@example.org>", "digest:7")
    assert hard.data["diagnostic"] == "smtp; 550 5.1.1 <ada@example.com>: user unknown"
    assert (later.kind, later.recipient) == ("deferred", "bob@example.com")
    assert hard.event_id == "<r1@mx>:ada@example.com" != later.event_id


def test_a_feedback_report_is_a_complaint() -> None:
    feedback = ("Content-Type: message/feedback-report\r\n\r\nFeedback-Type: abuse\r\n"
                "User-Agent: SomeISP/1.0\r\nVersion: 1\r\n"
                "Original-Rcpt-To: <ada@example.com>\r\n")
    [complaint] = parse_inbound(report("feedback-report", feedback,
                                       f"Content-Type: text/rfc822-headers\r\n\r\n{ORIGINAL}"))
    assert (complaint.kind, complaint.recipient, complaint.provider_message_id) == (
        "complained", "ada@example.com", "<abc123@example.org>")
    assert complaint.data == {"feedback_type": "abuse"}


def test_mail_that_is_not_a_report_is_nothing_unless_it_unsubscribes() -> None:
    secret = b"0123456789abcdef0123456789abcdef"
    token = sign(secret, "ada@example.com", "bulk", 7)
    plain = b"From: ada@example.com\r\nSubject: hello\r\n\r\nhi\r\n"
    assert parse_inbound(plain, (secret,)) == []
    mailto = f"From: ada@example.com\r\nSubject: unsubscribe {token}\r\n\r\n".encode()
    [unsubscribe] = parse_inbound(mailto, (secret,))
    assert (unsubscribe.kind, unsubscribe.lane, unsubscribe.delivery_id) == (
        "unsubscribed", "bulk", 7)
    assert parse_inbound(mailto, ()) == []  # no secret configured: cannot verify
    assert parse_inbound(mailto.replace(token[-4:].encode(), b"AAAA"), (secret,)) == []
    other = report("disposition-notification", "Content-Type: text/plain\r\n\r\nx",
                   "Content-Type: text/plain\r\n\r\ny")
    assert parse_inbound(other) == []


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=2000),
    st.builds(lambda head, body: report("delivery-status", head, body),
              st.text(max_size=300), st.text(max_size=300)),
    st.builds(lambda head: report("feedback-report", head, "Content-Type: text/plain\r\n\r\n"),
              st.text(max_size=300)),
))
def test_no_inbound_message_makes_the_parser_raise(raw: bytes) -> None:
    """Whatever arrives at the bounce address: events or nothing, never an exception."""
    for found in parse_inbound(raw, (b"0123456789abcdef0123456789abcdef",)):
        assert found.kind in EVENT_KINDS


def test_a_report_with_text_no_database_keeps_is_left_out() -> None:
    status = ("Content-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx\r\n\r\n"
              "Final-Recipient: rfc822; ada@example.com\r\nAction: failed\r\nStatus: 5.1.1\r\n"
              "Diagnostic-Code: smtp; 550 \x00 nul\r\n")
    raw = report("delivery-status", status, "Content-Type: text/plain\r\n\r\nx")
    assert parse_inbound(raw) == []
    assert len(parse_inbound(raw.replace(b"\x00", b"0"))) == 1
