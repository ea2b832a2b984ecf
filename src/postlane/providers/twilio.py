"""Twilio's Messages API: ``twilio://ACCOUNT_SID:AUTH_TOKEN@?from=%2B15005550006``.

One SMS is ``POST /2010-04-01/Accounts/{AccountSid}/Messages.json`` on
``https://api.twilio.com`` (``base_url=`` overrides it), form-encoded ``To``, ``From`` (or
``MessagingServiceSid``, ``messaging_service=MG...``) and ``Body``, with HTTP Basic
authentication (the account SID and its auth token; the token may come from
``POSTLANE_TWILIO_AUTH_TOKEN`` instead of the URL). Twilio answers ``201`` with the message
resource (``sid``, ``status``, ``num_segments``); a refusal carries
``{"code": n, "message": "...", "more_info": "...", "status": s}``, and the code decides.

Twilio takes no idempotency key and cannot be asked about ours: an ambiguous send is held
for an operator or resent, as the lane says (the key still travels, as ``X-Postlane-Key``,
for the logs at both ends). Options: those of every HTTP adapter (``timeout``,
``connect_timeout``, ``pool``, ``account``), ``status_callback=URL``, and
``account_retry_after=60`` (seconds to wait out a full sender queue, 21611).
"""

from __future__ import annotations

import base64
from typing import Any

import httpx

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass
from postlane.errors import ConfigurationError, InvalidMessage
from postlane.providers.http import (
    HttpApiProvider,
    http_options,
    json_body,
    outcome_of_status,
    refusal,
    response_text,
    retry_after_of,
)
from postlane.providers.mime import KEY_HEADER
from postlane.providers.options import ProviderURL, Secret, secret
from postlane.providers.sms import SmsProvider

TWILIO_TOKEN_ENV = "POSTLANE_TWILIO_AUTH_TOKEN"
TWILIO_API = "https://api.twilio.com"

ERROR_CODES: dict[int, tuple[OutcomeClass, str]] = {
    20003: (OutcomeClass.ACCOUNT, "authentication failed (account SID or auth token)"),
    20404: (OutcomeClass.ACCOUNT, "not found: is the account SID right?"),
    20429: (OutcomeClass.THROTTLED, "too many requests"),
    21211: (OutcomeClass.PERMANENT, "invalid 'To' phone number"),
    21214: (OutcomeClass.PERMANENT, "the 'To' number cannot be reached"),
    21408: (OutcomeClass.PERMANENT, "sending to the recipient's region is not enabled"),
    21602: (OutcomeClass.PERMANENT, "a message body is required"),
    21603: (OutcomeClass.ACCOUNT, "a 'From' number is required"),
    21604: (OutcomeClass.PERMANENT, "a 'To' number is required"),
    21606: (OutcomeClass.ACCOUNT, "the 'From' number is not an SMS-capable number of the "
                                  "account"),
    21608: (OutcomeClass.PERMANENT, "a trial account may only send to verified numbers"),
    21610: (OutcomeClass.PERMANENT, "the recipient unsubscribed (replied STOP)"),
    21611: (OutcomeClass.THROTTLED, "the 'From' number's queue is full"),
    21612: (OutcomeClass.PERMANENT, "the 'To' number is not reachable by SMS"),
    21614: (OutcomeClass.PERMANENT, "the 'To' number is not a mobile number"),
    21617: (OutcomeClass.PERMANENT, "the body exceeds 1600 characters"),
}
"""Twilio error ``code`` -> outcome class, from Twilio's error dictionary. Credentials, an
account SID that does not exist and a sender the account cannot use are *account* trouble
(the breaker opens; nothing is dead-lettered). A full sender queue (21611) is *throttled*
for ``account_retry_after``. What the recipient's number or the text makes impossible is
*permanent*. Codes not listed fall back to the HTTP status table."""


class TwilioProvider(SmsProvider, HttpApiProvider):
    name = "twilio"
    needs_sender = False
    """A sender is checked when the URL is read: from= or messaging_service=."""

    def __init__(self, account_sid: str, token: Secret, *, base_url: str = TWILIO_API,
                 sender: str | None = None, messaging_service: str | None = None,
                 status_callback: str | None = None, account_retry_after_s: float = 60.0,
                 **kwargs: Any) -> None:
        kwargs.pop("default_sender", None)
        HttpApiProvider.__init__(self, base_url, default_sender=sender, **kwargs)
        if not sender and not messaging_service:
            raise ConfigurationError("twilio:// needs a sender: from=+15551234567 or "
                                     "messaging_service=MG...")
        self.account_sid = account_sid
        self.token = token
        self.messaging_service = messaging_service
        self.status_callback = status_callback
        self.account_retry_after_s = account_retry_after_s

    @classmethod
    def from_url(cls, url: str, **extra: Any) -> TwilioProvider:
        parsed = ProviderURL.parse(url)
        if parsed.scheme != "twilio":
            raise ConfigurationError(f"not a twilio:// URL: {parsed.redacted!r}")
        if not parsed.username or not parsed.username.startswith("AC"):
            raise ConfigurationError("twilio:// needs the account SID (AC...) as the user: "
                                     "twilio://ACxxxx:AUTH_TOKEN@?from=%2B15551234567")
        token = secret(parsed.password, TWILIO_TOKEN_ENV)
        if token is None:
            raise ConfigurationError(f"twilio:// needs an auth token: in the URL or in "
                                     f"{TWILIO_TOKEN_ENV}")
        options = http_options(parsed)
        provider = cls(
            parsed.username, token,
            base_url=parsed.text("base_url", TWILIO_API) or TWILIO_API,
            sender=options.pop("default_sender"),
            messaging_service=parsed.text("messaging_service"),
            status_callback=parsed.text("status_callback"),
            account_retry_after_s=parsed.number("account_retry_after", 60.0),
            **options, **extra,
        )
        parsed.finish()
        return provider

    @property
    def account(self) -> str:
        return self._account or f"twilio:{self.account_sid}"

    def __repr__(self) -> str:
        return f"TwilioProvider({self.account_sid!r}, {self.base_url!r})"

    async def send_sms(self, delivery: Delivery) -> Outcome:
        return await HttpApiProvider.send(self, delivery)

    def build_request(self, delivery: Delivery) -> httpx.Request:
        if not delivery.text:
            raise InvalidMessage("an SMS needs a text", field="text")
        form = {"To": delivery.recipient, "Body": delivery.text}
        if self.messaging_service:
            form["MessagingServiceSid"] = self.messaging_service
        else:
            assert self.default_sender is not None
            form["From"] = self.default_sender
        if self.status_callback:
            form["StatusCallback"] = self.status_callback
        return self.client.build_request(
            "POST", f"{self.base_url}/2010-04-01/Accounts/{self.account_sid}/Messages.json",
            data=form,
            headers={"Accept": "application/json", "Authorization": self._basic_auth(),
                     KEY_HEADER: delivery.key})

    def _basic_auth(self) -> str:
        pair = f"{self.account_sid}:{self.token.reveal()}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")

    def map_response(self, response: httpx.Response) -> Outcome:
        return twilio_outcome(response, self.account_retry_after_s)


def twilio_outcome(response: httpx.Response, account_retry_after_s: float = 60.0) -> Outcome:
    """Twilio's answer as an outcome (see ``ERROR_CODES``)."""
    data = json_body(response)
    text = response_text(response)
    if 200 <= response.status_code < 300:
        sid = data.get("sid")
        return Outcome.accepted(str(sid) if sid else None, text)
    code = data.get("code")
    known = ERROR_CODES.get(code) if isinstance(code, int) else None
    if response.status_code >= 500 or known is None:
        return outcome_of_status(response)
    kind, meaning = known
    text = f"{text} [{meaning}]"
    if kind is OutcomeClass.ACCOUNT:
        return Outcome.account(text, retry_after_s=retry_after_of(response))
    if kind is OutcomeClass.THROTTLED:
        wait = retry_after_of(response)
        if wait is None and code == 21611:
            wait = account_retry_after_s
        return Outcome.throttled(wait, text)
    return refusal(response, text)
