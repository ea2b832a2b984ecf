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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from postlane.core.records import ProviderEvent
from postlane.core.validation import json_problem
from postlane.store.roles import ProviderEventStore
from postlane.webhooks.signatures import (
    WebhookMalformed,
    WebhookRejected,
    sign_standard,
    verify_sns,
    verify_standard,
)
from postlane.webhooks.sns_certificates import CertificateUnavailable, SnsCertificates

__all__ = ["CertificateUnavailable", "SnsCertificates", "WebhookConfig", "WebhookMalformed",
           "WebhookRejected", "WebhookResult", "receive", "sign_standard"]

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
    recorded: list[tuple[str, str]] = field(default_factory=list)
    """(lane, kind) of each event attached to a delivery for the first time: what the
    metrics count (``postlane_provider_events_total``)."""


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    secrets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tolerance_s: int = 300
    certificates: SnsCertificates | None = None
    clock: Callable[[], float] = time.time
    sns_topics: tuple[str, ...] = ()
    """TopicArns whose notifications ``ses`` accepts (``POSTLANE_WEBHOOK_SES_TOPICS``)."""

    @classmethod
    def from_env(cls, certificates: SnsCertificates | None = None) -> WebhookConfig:
        secrets = {}
        for provider in ("sandbox", "resend"):
            raw = os.environ.get(f"POSTLANE_WEBHOOK_SECRET_{provider.upper()}", "")
            secrets[provider] = tuple(s.strip() for s in raw.split(",") if s.strip())
        topics = tuple(t.strip() for t in os.environ.get(SES_TOPICS_ENV, "").split(",")
                       if t.strip())
        return cls(secrets=secrets, certificates=certificates, sns_topics=topics)

    def secrets_for(self, provider: str) -> tuple[str, ...]:
        return tuple(self.secrets.get(provider, ()))


async def receive(store: ProviderEventStore, provider: str, headers: Mapping[str, str], body: bytes,
                  config: WebhookConfig | None = None) -> WebhookResult:
    """Verify and record one webhook request; raises ``WebhookRejected`` (-> 401),
    ``WebhookMalformed`` (-> 400) for a payload that cannot be read or stored, or
    ``CertificateUnavailable`` (-> 503)."""
    config = config or WebhookConfig.from_env()
    if provider in ("sandbox", "resend"):
        prefix = "webhook" if provider == "sandbox" else "svix"
        event_id = verify_standard(config.secrets_for(provider), headers, body,
                                   now=config.clock(), prefix=prefix,
                                   tolerance_s=config.tolerance_s)
        event = _parse_standard(provider, event_id, body)
    elif provider == "ses":
        certificates = config.certificates or _CERTIFICATES
        message = await verify_sns(body, certificates.get, topics=config.sns_topics,
                                   now=config.clock())
        _check_storable(message)
        if message["Type"] != "Notification":
            return WebhookResult(200, f"SNS {message['Type']} received; confirm the "
                                      "subscription by visiting its SubscribeURL")
        event = _parse_ses(str(message["MessageId"]), str(message.get("Message", "")))
    else:
        raise WebhookRejected(f"unknown webhook provider {provider!r} (sandbox, resend, ses)")
    if event is None:
        return WebhookResult(200, "event type ignored")
    result = await store.record_provider_event(event)
    detail = ("duplicate event, already processed" if result.duplicate
              else "recorded" if result.delivery_id is not None
              else "no delivery with that provider message id")
    return WebhookResult(200, detail, [{
        "event_id": event.event_id, "kind": event.kind, "delivery_id": result.delivery_id,
        "duplicate": result.duplicate, "suppressed": result.suppressed,
    }], recorded=[] if result.duplicate or result.lane is None else [(result.lane, event.kind)])


_STANDARD_KINDS = {
    "email.delivered": "delivered", "email.bounced": "bounced",
    "email.complained": "complained", "email.opened": "opened", "email.clicked": "clicked",
    "email.delivery_delayed": "deferred",
}


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
    if kind == "bounced" and bounce_type not in ("hard", "permanent"):
        kind = "deferred"
    return ProviderEvent(provider, event_id, kind, str(message_id) if message_id else None,
                         recipient, {"type": payload.get("type"), "bounce_type": bounce_type}
                         if kind in ("bounced", "deferred") else {"type": payload.get("type")})


def _parse_ses(event_id: str, message_text: str) -> ProviderEvent | None:
    try:
        message = _json(message_text, "SNS Message")
    except WebhookMalformed as exc:
        raise WebhookMalformed(f"{exc} (not an SES event)") from None
    kind_name = str(message.get("eventType") or message.get("notificationType") or "")
    mail = message.get("mail") or {}
    recipients = mail.get("destination") or []
    kind = {"Delivery": "delivered", "Complaint": "complained", "Open": "opened",
            "Click": "clicked", "DeliveryDelay": "deferred"}.get(kind_name)
    if kind_name == "Bounce":
        bounce = message.get("bounce") or {}
        kind = "bounced" if bounce.get("bounceType") == "Permanent" else "deferred"
        bounced = bounce.get("bouncedRecipients") or []
        if bounced:
            recipients = [r.get("emailAddress") for r in bounced]
    if kind is None:
        return None
    return ProviderEvent("ses", event_id, kind, mail.get("messageId"),
                         recipients[0] if recipients else None, {"type": kind_name})
