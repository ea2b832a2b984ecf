"""Postmark: ``postmark://?message_stream=outbound`` with the server token in
``POSTLANE_POSTMARK_TOKEN`` (or ``postmark://:TOKEN@``), sent as ``X-Postmark-Server-Token``
to ``POST https://api.postmarkapp.com/email`` (``base_url=`` overrides the host).

Postmark has no idempotency key and no lookup by our key: an ambiguous send is held for an
operator or resent, as the lane says. The key travels as the ``X-Postlane-Key`` header and
in ``Metadata`` so Postmark's webhooks can be joined back.

Errors come as HTTP 422 (or another status) with ``{"ErrorCode": n, "Message": "..."}``;
the code decides. The table follows Postmark's public API documentation as we know it;
codes not in it fall back to the HTTP status table of ``postlane.providers.http``.
"""

from __future__ import annotations

from typing import Any

import httpx

from postlane.core.addresses import wire_address
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass
from postlane.errors import ConfigurationError
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
    provider_metadata,
    sender_of,
    wire_headers,
)
from postlane.providers.options import ProviderURL, Secret, secret

POSTMARK_TOKEN_ENV = "POSTLANE_POSTMARK_TOKEN"
POSTMARK_API = "https://api.postmarkapp.com"
POSTMARK_NO_UTF8 = "Postmark does not accept Unicode mailbox names"
"""Postmark answers ``ErrorCode`` 300 "Illegal email mailbox" to one, and its support has
said such recipients are not supported; a Unicode domain goes as punycode."""

ERROR_CODES: dict[int, tuple[OutcomeClass, str]] = {
    10: (OutcomeClass.ACCOUNT, "bad or missing server token (the account, not the message)"),
    100: (OutcomeClass.TRANSIENT, "maintenance"),
    300: (OutcomeClass.PERMANENT, "invalid email request"),
    400: (OutcomeClass.ACCOUNT, "sender signature not found"),
    401: (OutcomeClass.ACCOUNT, "sender signature not confirmed"),
    402: (OutcomeClass.PERMANENT, "invalid JSON"),
    403: (OutcomeClass.PERMANENT, "incompatible JSON"),
    405: (OutcomeClass.THROTTLED, "not allowed to send: the account is out of credits"),
    406: (OutcomeClass.PERMANENT, "inactive recipient (bounced, complained or suppressed)"),
    409: (OutcomeClass.PERMANENT, "JSON required"),
    410: (OutcomeClass.PERMANENT, "too many batch messages"),
    411: (OutcomeClass.PERMANENT, "forbidden attachment type"),
    412: (OutcomeClass.PERMANENT, "account pending approval: recipient outside its domain"),
}
"""Postmark ``ErrorCode`` -> outcome class. An account-wide stop (405: no credits) is
*throttled* with ``account_retry_after`` so nothing is dead-lettered and no attempt spent.
A bad token (10) and a sender signature that is missing or unconfirmed (400, 401) are
*account*: the breaker opens with Postmark's words as the cause, nothing is dead-lettered.
Any other refusal that carries a ``Retry-After`` is throttled at that time."""


class PostmarkProvider(HttpApiProvider):
    name = "postmark"

    def __init__(self, token: Secret | None, *, base_url: str = POSTMARK_API,
                 message_stream: str | None = None, account_retry_after_s: float = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.token = token
        self.message_stream = message_stream
        self.account_retry_after_s = account_retry_after_s

    @classmethod
    def from_url(cls, url: str, **extra: Any) -> PostmarkProvider:
        parsed = ProviderURL.parse(url)
        if parsed.scheme != "postmark":
            raise ConfigurationError(f"not a postmark:// URL: {parsed.redacted!r}")
        token = secret(parsed.password, POSTMARK_TOKEN_ENV)
        if token is None:
            raise ConfigurationError(f"postmark:// needs a server token: set {POSTMARK_TOKEN_ENV}")
        provider = cls(
            token,
            base_url=parsed.text("base_url", POSTMARK_API) or POSTMARK_API,
            message_stream=parsed.text("message_stream"),
            account_retry_after_s=parsed.number("account_retry_after", 60.0),
            **http_options(parsed), **extra,
        )
        parsed.finish()
        return provider

    @property
    def account(self) -> str:
        return self._account or "postmark"

    def build_request(self, delivery: Delivery) -> httpx.Request:
        body = postmark_payload(delivery, self.default_sender, self.message_stream)
        headers = {"Accept": "application/json",
                   "X-Postmark-Server-Token": self.token.reveal() if self.token else ""}
        return self.client.build_request("POST", f"{self.base_url}/email", json=body,
                                         headers=headers)

    def map_response(self, response: httpx.Response) -> Outcome:
        return postmark_outcome(response, self.account_retry_after_s)


def postmark_payload(delivery: Delivery, default_sender: str | None,
                     message_stream: str | None = None) -> dict[str, Any]:
    """The ``POST /email`` body; raises ``InvalidMessage`` for what cannot be sent."""
    sender = sender_of(delivery, default_sender)
    check_delivery(delivery, sender)
    body: dict[str, Any] = {
        "From": wire_address(sender, field="sender", utf8=False, transport=POSTMARK_NO_UTF8),
        "To": wire_address(delivery.recipient, field="to", utf8=False,
                           transport=POSTMARK_NO_UTF8),
        "Subject": delivery.subject,
        "Headers": [{"Name": n, "Value": v} for n, v in wire_headers(
            delivery, utf8=False, transport=POSTMARK_NO_UTF8).items()],
        "Metadata": {**{k: str(v) for k, v in provider_metadata(delivery).items()},
                     "postlane_key": delivery.key,
                     "postlane_delivery_id": str(delivery.id)},
    }
    if delivery.text is not None:
        body["TextBody"] = delivery.text
    if delivery.html is not None:
        body["HtmlBody"] = delivery.html
    if message_stream:
        body["MessageStream"] = message_stream
    if delivery.attachments:
        # Postmark's documented form: Name, base64 Content, ContentType, and for an inline
        # part ContentID "cid:<id>"; an invite goes as a text/calendar file.
        body["Attachments"] = [
            {"Name": a["filename"], "Content": a["content"], "ContentType": a["content_type"],
             **({"ContentID": f"cid:{a['content_id']}"} if a["content_id"] else {})}
            for a in json_attachments(delivery.attachments)]
    return body


def postmark_outcome(response: httpx.Response, account_retry_after_s: float = 60.0) -> Outcome:
    data = json_body(response)
    code = data.get("ErrorCode")
    text = response_text(response)
    if response.status_code == 200 and code in (0, None):
        message_id = data.get("MessageID")
        return Outcome.accepted(str(message_id) if message_id else None, text)
    if response.status_code in (429, 500, 502, 503, 504) or not isinstance(code, int):
        return outcome_of_status(response)
    known = ERROR_CODES.get(code)
    if known is None:
        return outcome_of_status(response)
    kind = known[0]
    text = f"{text} [{known[1]}]"
    if kind is OutcomeClass.ACCOUNT:
        return Outcome.account(text, retry_after_s=retry_after_of(response))
    if kind is OutcomeClass.THROTTLED:
        return Outcome.throttled(retry_after_of(response) or account_retry_after_s, text)
    if kind is OutcomeClass.TRANSIENT:
        return Outcome.transient(text, retry_after_s=retry_after_of(response))
    return refusal(response, text)
