"""Provider webhooks: verify, normalise, and record each delivery event exactly once.

``receive(store, provider, headers, body)`` is what the HTTP route calls. Providers:

- ``sandbox``: Standard Webhooks; secrets in ``POSTLANE_WEBHOOK_SECRET_SANDBOX``
  (comma-separated: during a rotation both the old and the new secret verify).
- ``resend``: the same scheme with ``svix-`` headers; ``POSTLANE_WEBHOOK_SECRET_RESEND``.
- ``ses``: Amazon SNS notifications carrying SES events, verified against the SNS
  certificate (fetched only from ``https://sns.<region>.amazonaws.com/....pem``, without
  blocking, cached: ``sns_certificates``), from the topics listed in
  ``POSTLANE_WEBHOOK_SES_TOPICS`` (comma-separated TopicArns; none listed: every SES
  webhook is refused, since any AWS account can sign a notification to this endpoint),
  and at most an hour old. A certificate that cannot be fetched now raises
  ``CertificateUnavailable`` (the API answers 503: SNS retries).
- ``postmark``: Postmark's bounce, spam-complaint, delivery, subscription-change, open and
  click webhooks (JSON, ``RecordType``). Postmark signs nothing; as it recommends, the
  webhook URL carries credentials: basic auth (``https://postmark:SECRET@host/v1/webhooks/
  postmark``) or a ``?token=SECRET`` parameter, checked against
  ``POSTLANE_WEBHOOK_SECRET_POSTMARK`` (comma-separated during a rotation).
- ``smtp``: a raw message (RFC 5322 bytes) as it arrived at the bounce address: a DSN
  (RFC 3464), a feedback report (RFC 5965) or a mailto unsubscribe (``webhooks.dsn``);
  authenticated the same way with ``POSTLANE_WEBHOOK_SECRET_SMTP``. The Maildir form is
  ``postlane bounces maildir``.

Every event is normalised to one model (``core.records.EVENT_KINDS``; the table per
provider is in docs/deliverability.md), and a run of soft bounces suppresses an address for
a while under the policy of ``POSTLANE_SOFT_BOUNCE_*`` (``core.deliverability``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from postlane.core.deliverability import DEFAULT_POLICY, SuppressionPolicy
from postlane.core.records import ProviderEvent
from postlane.core.unsubscribe import secrets_from_env
from postlane.core.validation import json_problem
from postlane.store.roles import ProviderEventStore
from postlane.webhooks import dsn
from postlane.webhooks.signatures import (
    WebhookMalformed,
    WebhookRejected,
    sign_standard,
    verify_shared_secret,
    verify_sns,
    verify_standard,
)
from postlane.webhooks.sns_certificates import CertificateUnavailable, SnsCertificates

__all__ = [
    "PROVIDERS",
    "CertificateUnavailable",
    "SnsCertificates",
    "WebhookConfig",
    "WebhookMalformed",
    "WebhookRejected",
    "WebhookResult",
    "receive",
    "record_events",
    "sign_standard",
]

PROVIDERS = ("sandbox", "resend", "ses", "postmark", "smtp")

MAX_DEPTH = 32
"""Deepest nesting a payload may have; every provider's events stay under ten levels."""
SES_TOPICS_ENV = "POSTLANE_WEBHOOK_SES_TOPICS"
_CERTIFICATES = SnsCertificates()
"""The process's certificate cache when the caller brings none (the API brings its own)."""


@dataclass(frozen=True, slots=True)
class WebhookResult:
    status: int
    detail: str
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    secrets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tolerance_s: int = 300
    certificates: SnsCertificates | None = None
    clock: Callable[[], float] = time.time
    sns_topics: tuple[str, ...] = ()
    """TopicArns whose notifications ``ses`` accepts (``POSTLANE_WEBHOOK_SES_TOPICS``)."""
    policy: SuppressionPolicy = DEFAULT_POLICY
    """When soft bounces suppress an address (``POSTLANE_SOFT_BOUNCE_*``)."""
    unsubscribe_secrets: tuple[bytes, ...] = ()
    """Verify the tokens of mailto unsubscribes arriving at ``smtp``
    (``POSTLANE_UNSUBSCRIBE_SECRET``)."""

    @classmethod
    def from_env(cls, certificates: SnsCertificates | None = None) -> WebhookConfig:
        secrets = {}
        for provider in ("sandbox", "resend", "postmark", "smtp"):
            raw = os.environ.get(f"POSTLANE_WEBHOOK_SECRET_{provider.upper()}", "")
            secrets[provider] = tuple(s.strip() for s in raw.split(",") if s.strip())
        topics = tuple(t.strip() for t in os.environ.get(SES_TOPICS_ENV, "").split(",")
                       if t.strip())
        return cls(secrets=secrets, certificates=certificates, sns_topics=topics,
                   policy=SuppressionPolicy.from_env(),
                   unsubscribe_secrets=secrets_from_env())

    def secrets_for(self, provider: str) -> tuple[str, ...]:
        return tuple(self.secrets.get(provider, ()))


async def receive(store: ProviderEventStore, provider: str, headers: Mapping[str, str], body: bytes,
                  config: WebhookConfig | None = None, *,
                  token: str | None = None) -> WebhookResult:
    """Verify and record one webhook request; raises ``WebhookRejected`` (-> 401),
    ``WebhookMalformed`` (-> 400) for a payload that cannot be read or stored, or
    ``CertificateUnavailable`` (-> 503). ``token``: the request's ``token`` query parameter
    (``postmark`` and ``smtp``)."""
    config = config or WebhookConfig.from_env()
    events: list[ProviderEvent]
    if provider in ("sandbox", "resend"):
        prefix = "webhook" if provider == "sandbox" else "svix"
        event_id = verify_standard(config.secrets_for(provider), headers, body,
                                   now=config.clock(), prefix=prefix,
                                   tolerance_s=config.tolerance_s)
        events = _some(_parse_standard(provider, event_id, body))
    elif provider == "ses":
        certificates = config.certificates or _CERTIFICATES
        message = await verify_sns(body, certificates.get, topics=config.sns_topics,
                                   now=config.clock())
        _check_storable(message)
        if message["Type"] != "Notification":
            return WebhookResult(200, f"SNS {message['Type']} received; confirm the "
                                      "subscription by visiting its SubscribeURL")
        events = _some(_parse_ses(str(message["MessageId"]), str(message.get("Message", ""))))
    elif provider == "postmark":
        verify_shared_secret(config.secrets_for(provider), headers, token, provider=provider)
        events = _some(parse_postmark(_json(body)))
    elif provider == "smtp":
        verify_shared_secret(config.secrets_for(provider), headers, token, provider=provider)
        if len(body) > dsn.MAX_BYTES:
            raise WebhookMalformed(f"the message is over {dsn.MAX_BYTES} bytes")
        events = dsn.parse_inbound(body, config.unsubscribe_secrets)
    else:
        raise WebhookRejected(f"unknown webhook provider {provider!r} "
                              f"({', '.join(PROVIDERS)})")
    if not events:
        return WebhookResult(200, "event type ignored")
    return await record_events(store, events, config.policy)


async def record_events(store: ProviderEventStore, events: list[ProviderEvent],
                        policy: SuppressionPolicy = DEFAULT_POLICY) -> WebhookResult:
    """Record verified events, each once; the result says what became of each."""
    details = []
    answers = []
    for event in events:
        result = await store.record_provider_event(event, policy)
        details.append("duplicate event, already processed" if result.duplicate
                       else "recorded" if result.delivery_id is not None
                       else "suppressed" if result.suppressed
                       else "no delivery with that provider message id")
        answers.append({"event_id": event.event_id, "kind": event.kind,
                        "delivery_id": result.delivery_id, "duplicate": result.duplicate,
                        "suppressed": result.suppressed})
    return WebhookResult(200, "; ".join(dict.fromkeys(details)), answers)


def _some(event: ProviderEvent | None) -> list[ProviderEvent]:
    return [] if event is None else [event]


_STANDARD_KINDS = {
    "email.delivered": "delivered", "email.bounced": "bounced",
    "email.complained": "complained", "email.opened": "opened", "email.clicked": "clicked",
    "email.delivery_delayed": "deferred", "email.failed": "rejected",
}
_HARD_BOUNCE_TYPES = ("hard", "permanent")


def _json(body: bytes | str, what: str = "body") -> dict[str, Any]:
    """A verified payload as a JSON object every string of which the store can keep."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WebhookMalformed(f"{what} is not JSON") from None
    except RecursionError:
        raise WebhookMalformed(f"{what} is JSON nested too deep to read") from None
    if not isinstance(data, dict):
        raise WebhookMalformed(f"{what} is not a JSON object")
    _check_storable(data, what)
    return data


def _check_storable(data: dict[str, Any], what: str = "body") -> None:
    """A NUL or a lone surrogate cannot be stored (PostgreSQL refuses NUL in text and jsonb;
    a lone surrogate has no UTF-8 form); refused here rather than failing the write."""
    problem = json_problem(data, max_depth=MAX_DEPTH)
    if problem is not None:
        raise WebhookMalformed(f"{what} cannot be stored: {problem}")


def _parse_standard(provider: str, event_id: str, body: bytes) -> ProviderEvent | None:
    """The sandbox's and Resend's event shape: ``{"type": "email.bounced", "data": {...}}``."""
    payload = _json(body)
    kind = _STANDARD_KINDS.get(str(payload.get("type")))
    data = payload.get("data")
    if kind is None or not isinstance(data, dict):
        return None
    message_id = data.get("message_id") or data.get("email_id")
    to = data.get("to")
    recipient = to[0] if isinstance(to, list) and to else to if isinstance(to, str) else None
    raw_bounce = data.get("bounce")
    bounce: dict[str, Any] = raw_bounce if isinstance(raw_bounce, dict) else {}
    bounce_type = str(data.get("bounce_type") or bounce.get("type") or "hard").lower()
    if kind == "bounced" and bounce_type not in _HARD_BOUNCE_TYPES:
        kind = "soft_bounced"  # Resend's Transient and Undetermined, the sandbox's soft
    return ProviderEvent(provider, event_id, kind, str(message_id) if message_id else None,
                         recipient, {"type": payload.get("type"), "bounce_type": bounce_type}
                         if kind in ("bounced", "soft_bounced") else {"type": payload.get("type")})


def _parse_ses(event_id: str, message_text: str) -> ProviderEvent | None:
    try:
        message = _json(message_text, "SNS Message")
    except WebhookMalformed as exc:
        raise WebhookMalformed(f"{exc} (not an SES event)") from None
    kind_name = str(message.get("eventType") or message.get("notificationType") or "")
    mail = message.get("mail") or {}
    recipients = mail.get("destination") or []
    kind = {"Delivery": "delivered", "Complaint": "complained", "Open": "opened",
            "Click": "clicked", "DeliveryDelay": "deferred", "Reject": "rejected",
            "Rendering Failure": "rejected"}.get(kind_name)
    if kind_name == "Bounce":
        bounce = message.get("bounce") or {}
        kind = "bounced" if bounce.get("bounceType") == "Permanent" else "soft_bounced"
        bounced = bounce.get("bouncedRecipients") or []
        if bounced:
            recipients = [r.get("emailAddress") for r in bounced]
    if kind_name == "Subscription":  # SES subscription management: an unsubscribe-all
        preferences = (message.get("subscription") or {}).get("newTopicPreferences") or {}
        kind = "unsubscribed" if preferences.get("unsubscribeAll") else None
    if kind is None:
        return None
    return ProviderEvent("ses", event_id, kind, mail.get("messageId"),
                         recipients[0] if recipients else None, {"type": kind_name})


# Postmark's bounce types (``Type`` of a ``Bounce`` record) in the normalised model; types
# that are not about delivery (AutoResponder, AddressChange, Subscribe...) are ignored.
_POSTMARK_BOUNCES = {
    "HardBounce": "bounced", "BadEmailAddress": "bounced",
    "Transient": "soft_bounced", "SoftBounce": "soft_bounced", "DnsError": "soft_bounced",
    "SpamNotification": "soft_bounced",
    "Unsubscribe": "unsubscribed", "SpamComplaint": "complained",
    "Blocked": "rejected", "DMARCPolicy": "rejected", "VirusNotification": "rejected",
    "SMTPApiError": "rejected", "ManuallyDeactivated": "rejected", "Unconfirmed": "rejected",
    "TemplateRenderingFailed": "rejected",
}
_POSTMARK_SUBSCRIPTION = {"HardBounce": "bounced", "SpamComplaint": "complained",
                          "ManualSuppression": "unsubscribed"}


def parse_postmark(payload: dict[str, Any]) -> ProviderEvent | None:
    """One Postmark webhook (``RecordType`` Bounce, SpamComplaint, Delivery,
    SubscriptionChange, Open, Click) as a normalised event; None for what is not about
    delivery. Postmark's ``MessageID`` is the id its ``/email`` answer gave, which the
    adapter records as the provider message id."""
    record = str(payload.get("RecordType") or "")
    message_id = str(payload.get("MessageID") or "") or None
    recipient = payload.get("Email") or payload.get("Recipient")
    address = str(recipient) if isinstance(recipient, str) and recipient else None
    data: dict[str, Any] = {"type": record}
    kind: str | None
    if record in ("Bounce", "SpamComplaint"):
        bounce_type = str(payload.get("Type") or record)
        kind = _POSTMARK_BOUNCES.get(bounce_type)
        event_id = f"{record.lower()}:{payload.get('ID') or message_id}"
        data["bounce_type"] = bounce_type
        if payload.get("Description"):
            data["description"] = str(payload["Description"])[:500]
    elif record == "Delivery":
        kind, event_id = "delivered", f"delivery:{message_id}:{address}"
    elif record == "SubscriptionChange":
        reason = str(payload.get("SuppressionReason") or "")
        kind = (_POSTMARK_SUBSCRIPTION.get(reason) if payload.get("SuppressSending") is True
                else None)
        event_id = f"subscription:{message_id}:{address}:{payload.get('ChangedAt')}"
        data["suppression_reason"] = reason
    elif record in ("Open", "Click"):
        kind = "opened" if record == "Open" else "clicked"
        at = payload.get("ReceivedAt")
        event_id = f"{record.lower()}:{message_id}:{address}:{at}"
    else:
        return None
    if kind is None:
        return None
    if payload.get("MessageStream"):
        data["message_stream"] = str(payload["MessageStream"])
    return ProviderEvent("postmark", event_id, kind, message_id, address, data)
