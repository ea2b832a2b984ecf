"""Resend: ``resend://`` with the API key in ``POSTLANE_RESEND_TOKEN`` (or
``resend://:KEY@``), ``POST https://api.resend.com/emails`` with ``Authorization: Bearer`` and
the delivery's key in ``Idempotency-Key`` (Resend remembers it for 24 hours and answers a
repeat with the original result, so an ambiguous send is simply retried within that window).

Errors are ``{"statusCode": n, "name": "...", "message": "..."}``; the table below follows
Resend's public error reference. ``base_url=`` points it at a local server for tests.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from postlane.core.addresses import wire_address
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass
from postlane.errors import ConfigurationError
from postlane.providers.base import Capabilities
from postlane.providers.http import (
    HttpApiProvider,
    http_options,
    json_body,
    outcome_of_status,
    refusal,
    response_text,
    retry_after_of,
)
from postlane.providers.mime import (
    check_delivery,
    json_attachments,
    key_digest,
    sender_of,
    wire_headers,
)
from postlane.providers.options import ProviderURL, Secret, secret

RESEND_TOKEN_ENV = "POSTLANE_RESEND_TOKEN"
RESEND_API = "https://api.resend.com"
RESEND_NO_UTF8 = "Resend does not document accepting Unicode mailbox names"
"""Its API reference says nothing about non-ASCII addresses, so none is sent on a guess: a
mangled or misrouted address is worse than a clear refusal. A Unicode domain goes as
punycode."""

ERROR_NAMES: dict[str, OutcomeClass] = {
    "invalid_idempotency_key": OutcomeClass.PERMANENT,
    "validation_error": OutcomeClass.PERMANENT,
    "missing_required_field": OutcomeClass.PERMANENT,
    "invalid_from_address": OutcomeClass.PERMANENT,
    "invalid_attachment": OutcomeClass.PERMANENT,
    "invalid_parameter": OutcomeClass.PERMANENT,
    "not_found": OutcomeClass.PERMANENT,
    "method_not_allowed": OutcomeClass.PERMANENT,
    "invalid_idempotent_request": OutcomeClass.PERMANENT,
    "missing_api_key": OutcomeClass.ACCOUNT,
    "restricted_api_key": OutcomeClass.ACCOUNT,
    "invalid_api_key": OutcomeClass.ACCOUNT,
    "concurrent_idempotent_requests": OutcomeClass.TRANSIENT,
    "rate_limit_exceeded": OutcomeClass.THROTTLED,
    "daily_quota_exceeded": OutcomeClass.THROTTLED,
    "monthly_quota_exceeded": OutcomeClass.THROTTLED,
    "application_error": OutcomeClass.TRANSIENT,
    "internal_server_error": OutcomeClass.TRANSIENT,
}
"""Resend error ``name`` -> outcome class. Key problems (401/403) are the account's, not
the message's: *account*, so the breaker opens at once and nothing is dead-lettered; so is
a 403 ``validation_error`` about the sending domain not being verified (or the account still
in testing mode). A 409 ``concurrent_idempotent_requests``
means the first request with this key is still running: retry later and get its result.
Quota errors are throttled: no attempt is spent, the wait is ``Retry-After`` or
``quota_retry_after`` (default 300 s). Any other refusal that carries a ``Retry-After`` is
throttled at that time."""

_QUOTA = ("daily_quota_exceeded", "monthly_quota_exceeded")
_UNVERIFIED = ("not verified", "verify a domain", "verify your domain", "testing emails")
"""Words of a 403 ``validation_error`` that concern the account's sending identity."""


class ResendProvider(HttpApiProvider):
    name = "resend"
    capabilities = Capabilities(deduplicates_by_key=True, dedup_window=timedelta(hours=24))

    def __init__(self, token: Secret | None, *, base_url: str = RESEND_API,
                 quota_retry_after_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.token = token
        self.quota_retry_after_s = quota_retry_after_s

    @classmethod
    def from_url(cls, url: str, **extra: Any) -> ResendProvider:
        parsed = ProviderURL.parse(url)
        if parsed.scheme != "resend":
            raise ConfigurationError(f"not a resend:// URL: {parsed.redacted!r}")
        token = secret(parsed.password, RESEND_TOKEN_ENV)
        if token is None:
            raise ConfigurationError(f"resend:// needs an API key: set {RESEND_TOKEN_ENV}")
        provider = cls(
            token,
            base_url=parsed.text("base_url", RESEND_API) or RESEND_API,
            quota_retry_after_s=parsed.number("quota_retry_after", 300.0),
            **http_options(parsed), **extra,
        )
        parsed.finish()
        return provider

    @property
    def account(self) -> str:
        return self._account or "resend"

    def build_request(self, delivery: Delivery) -> httpx.Request:
        body = resend_payload(delivery, self.default_sender)
        headers = {"Accept": "application/json", "Idempotency-Key": delivery.key,
                   "Authorization": f"Bearer {self.token.reveal() if self.token else ''}"}
        return self.client.build_request("POST", f"{self.base_url}/emails", json=body,
                                         headers=headers)

    def map_response(self, response: httpx.Response) -> Outcome:
        return resend_outcome(response, self.quota_retry_after_s)


def resend_payload(delivery: Delivery, default_sender: str | None) -> dict[str, Any]:
    """The ``POST /emails`` body; raises ``InvalidMessage`` for what cannot be sent."""
    sender = sender_of(delivery, default_sender)
    check_delivery(delivery, sender)
    body: dict[str, Any] = {
        "from": wire_address(sender, field="sender", utf8=False, transport=RESEND_NO_UTF8),
        "to": [wire_address(delivery.recipient, field="to", utf8=False,
                            transport=RESEND_NO_UTF8)],
        "subject": delivery.subject,
        "headers": wire_headers(delivery, utf8=False, transport=RESEND_NO_UTF8),
        # Tag values allow only ASCII letters, digits, '_' and '-': the key goes hashed.
        "tags": [{"name": "postlane_delivery_id", "value": str(delivery.id)},
                 {"name": "postlane_key_sha256", "value": key_digest(delivery.key)}],
    }
    if delivery.text is not None:
        body["text"] = delivery.text
    if delivery.html is not None:
        body["html"] = delivery.html
    if delivery.attachments:
        # Resend's documented form: filename, base64 content, content_type, and content_id
        # for a part the HTML names as cid:; an invite goes as a text/calendar file.
        body["attachments"] = [
            {"filename": a["filename"], "content": a["content"],
             "content_type": a["content_type"],
             **({"content_id": a["content_id"]} if a["content_id"] else {})}
            for a in json_attachments(delivery.attachments)]
    return body


def resend_outcome(response: httpx.Response, quota_retry_after_s: float = 300.0) -> Outcome:
    status = response.status_code
    if 200 <= status < 300 or status in (401, 504):
        # 401 is a key problem whatever its name (an invalid key may come as a 401
        # validation_error): transient, like every credentials error.
        return outcome_of_status(response)
    data = json_body(response)
    name = data.get("name")
    kind = ERROR_NAMES.get(name) if isinstance(name, str) else None
    if status == 403 and name == "validation_error" and any(
            words in str(data.get("message", "")).lower() for words in _UNVERIFIED):
        kind = OutcomeClass.ACCOUNT
    if kind is None:
        return outcome_of_status(response)
    text = response_text(response)
    if kind is OutcomeClass.ACCOUNT:
        return Outcome.account(text, retry_after_s=retry_after_of(response))
    if kind is OutcomeClass.THROTTLED:
        wait = retry_after_of(response)
        if wait is None and name in _QUOTA:
            wait = quota_retry_after_s
        return Outcome.throttled(wait, text)
    if kind is OutcomeClass.TRANSIENT:
        return Outcome.transient(text, retry_after_s=retry_after_of(response))
    return refusal(response, text)
