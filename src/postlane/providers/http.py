"""HTTP email APIs: one base with the transport mapping, and a generic JSON adapter.

``HttpApiProvider`` owns an ``httpx.AsyncClient`` (keep-alive, a bounded pool) and the part
of the mapping every HTTP API shares -- what a failure of the *transport* means. The point
of no return is the request fully written (the last byte of the body handed to the
socket); httpcore's ``trace`` extension says when that happened:

    connect refused / connect timeout / no pooled connection free   transient (never left)
    write timeout or write error (the request was not all written)  transient
    read timeout, dropped connection, protocol error, *before* the
      body was all written (the server cut us off mid-request)       transient
    read timeout, dropped connection, protocol error after it        ambiguous (may have left)

The phases reported (``postlane.core.outcomes.Phase``): queued (waiting for a pooled
connection), connect, tls, request (writing), response (written; waiting for the answer).
Over a transport that does not trace (``httpx.MockTransport``) the exception type alone
decides, as in the table.

The other half is a default table for the *status* (``outcome_of_status``), which
subclasses refine with the provider's own error codes:

    2xx                          accepted
    429                          throttled, with Retry-After (seconds or HTTP date)
    401, 403                     account: the credentials, not the message; the breaker
                                 opens at once and the deliveries wait, attempts unspent
    other 4xx with Retry-After   throttled at that time: "later", never a dead letter
    408, 409                     transient (request timeout; same key still in progress)
    other 4xx                    permanent
    504                          ambiguous (a gateway gave up; the service may have it)
    other 5xx                    transient, with Retry-After when given

The generic adapter, ``http(s)://host/path``, POSTs ``{to, from, subject, text, html, headers,
metadata}`` (and ``attachments``, a list of ``{filename, content_type, kind, content_id,
content}`` with ``content`` in base64 and ``kind`` one of ``attachment``, ``inline`` or
``calendar``, when the message has any) as JSON with the key in ``Idempotency-Key`` and a
bearer token from ``POSTLANE_HTTP_TOKEN`` (or the URL's password). The API is declared to
deduplicate by key (``dedupe=0`` says it does not). Options: ``timeout=10``,
``connect_timeout=5``, ``pool=20``, ``dedup_window=86400`` (seconds), ``from=ADDR``,
``account=NAME``, ``utf8=1`` (the API takes addresses with a Unicode local part; without it
such a delivery is refused as permanent, nothing sent). Domains always go as A-labels
(punycode).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from postlane.core.addresses import wire_address
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, Phase
from postlane.core.policy import parse_retry_after
from postlane.errors import ConfigurationError, InvalidMessage
from postlane.providers.base import Capabilities, Provider, refused_before_sending
from postlane.providers.mime import (
    check_delivery,
    json_attachments,
    provider_metadata,
    sender_of,
    wire_headers,
)
from postlane.providers.options import ProviderURL, Secret, secret
from postlane.providers.progress import AttemptProgress, current_progress

HTTP_TOKEN_ENV = "POSTLANE_HTTP_TOKEN"
RESPONSE_LIMIT = 2000
"""How much of a response body is kept as the outcome's response text."""
HTTP_NO_UTF8 = ("the API was not declared to take one (add utf8=1 to the provider URL if "
                "it does)")
ACCOUNT_STATUSES = (401, 403)
"""Statuses that speak of the account (its credentials, its permissions), never a message."""


class HttpApiProvider(Provider):
    """Base of the JSON email API adapters: subclasses build the request and read answers."""

    name = "http"
    needs_sender = True

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        pool: int = 20,
        default_sender: str | None = None,
        account: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=timeout_s)
        self.limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
        self.default_sender = default_sender
        self._account = account
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    @property
    def account(self) -> str:
        return self._account or f"{self.name}:{httpx.URL(self.base_url).host}"

    def configured_sender(self) -> str | None:
        return self.default_sender

    def endpoint(self) -> tuple[str, int] | None:
        url = httpx.URL(self.base_url)
        return url.host, url.port or (443 if url.scheme == "https" else 80)

    async def open(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout, limits=self.limits, transport=self._transport,
                follow_redirects=False,
            )

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError(f"{self.name} provider used before open()")
        return self._client

    # -- what a subclass fills in ----------------------------------------------------------
    def build_request(self, delivery: Delivery) -> httpx.Request:
        raise NotImplementedError

    def map_response(self, response: httpx.Response) -> Outcome:
        return outcome_of_status(response)

    # -- the send --------------------------------------------------------------------------
    async def send(self, delivery: Delivery) -> Outcome:
        if self._client is None:
            await self.open()
        try:
            request = self.build_request(delivery)
        except InvalidMessage as exc:
            return refused_before_sending(exc)
        progress = current_progress()
        progress.reach(Phase.QUEUED)
        trace = ExchangeTrace(progress)
        request.extensions["trace"] = trace
        try:
            response = await self.client.send(request)
        except httpx.HTTPError as exc:
            return outcome_of_transport_error(exc, trace.written).at(progress.phase)
        return self.map_response(response).at(Phase.RESPONSE)

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response | Outcome:
        """One request outside ``send`` (lookups): a transport failure becomes an Outcome."""
        if self._client is None:
            await self.open()
        try:
            return await self.client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            return outcome_of_transport_error(exc)


TRACE_PHASES: dict[str, Phase] = {
    "connection.connect_tcp.started": Phase.CONNECT,
    "connection.connect_unix_socket.started": Phase.CONNECT,
    "connection.start_tls.started": Phase.TLS,
    "http11.send_request_headers.started": Phase.REQUEST,
    "http2.send_request_headers.started": Phase.REQUEST,
    # Reported again as the body starts: an abandoned attempt stops before its body.
    "http11.send_request_body.started": Phase.REQUEST,
    "http2.send_request_body.started": Phase.REQUEST,
    "http11.send_request_body.complete": Phase.RESPONSE,
    "http2.send_request_body.complete": Phase.RESPONSE,
}
"""httpcore trace events -> the phase the exchange entered."""


class ExchangeTrace:
    """httpcore's ``trace`` extension for one request: moves the attempt's phase as the
    exchange goes on, and remembers whether the request was fully written."""

    def __init__(self, progress: AttemptProgress) -> None:
        self.progress = progress
        self.written: bool | None = None
        """True once the whole request was written, False before; None: no trace came
        (a transport that does not trace), so nothing is known."""

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        phase = TRACE_PHASES.get(event)
        if phase is None:
            return
        self.written = phase.may_have_reached_provider
        self.progress.reach(phase)


# -- the shared tables ---------------------------------------------------------------------
def outcome_of_transport_error(exc: httpx.HTTPError, written: bool | None = None) -> Outcome:
    """Whether the request can have reached the server decides transient vs ambiguous;
    ``written`` (from ``ExchangeTrace``) says whether it was fully written, when known."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return Outcome.transient(f"not sent: {text}")
    if isinstance(exc, (httpx.WriteTimeout, httpx.WriteError)):
        return Outcome.transient(f"not sent: the request was not fully written: {text}")
    if isinstance(exc, (httpx.TimeoutException, httpx.NetworkError,
                        httpx.RemoteProtocolError, httpx.DecodingError)):
        if written is False:
            return Outcome.transient(
                f"not sent: cut off before the request was fully written: {text}")
        return Outcome.ambiguous(f"no answer after the request left: {text}")
    # Anything else (a bad URL, a proxy refusing, a protocol error of ours) happens before
    # the provider saw a complete request.
    return Outcome.transient(f"not sent: {text}")


def retry_after_of(response: httpx.Response) -> float | None:
    return parse_retry_after(response.headers.get("retry-after"), datetime.now(UTC))


def response_text(response: httpx.Response) -> str:
    body = response.text[:RESPONSE_LIMIT] if response.content else ""
    return f"{response.status_code} {body}".strip()


def outcome_of_status(response: httpx.Response, provider_message_id: str | None = None
                      ) -> Outcome:
    """The default HTTP status table (see the module docstring)."""
    status = response.status_code
    text = response_text(response)
    if 200 <= status < 300:
        return Outcome.accepted(provider_message_id or message_id_of(response), text)
    if status == 429:
        return Outcome.throttled(retry_after_of(response), text)
    if status in ACCOUNT_STATUSES:
        return Outcome.account(text, retry_after_s=retry_after_of(response))
    if 400 <= status < 500:
        return outcome_of_4xx(response, text)
    if status == 504:
        return Outcome.ambiguous(text)
    if status >= 500:
        return Outcome.transient(text, retry_after_s=retry_after_of(response))
    # 1xx/3xx where an answer was expected: a misconfigured URL, not the message's fault.
    return Outcome.transient(text)


def outcome_of_4xx(response: httpx.Response, text: str) -> Outcome:
    """A refusal that is not the account's: 408/409 are transient, the rest permanent --
    unless it names a Retry-After (see ``refusal``)."""
    if retry_after_of(response) is None and response.status_code in (408, 409):
        return Outcome.transient(text)
    return refusal(response, text)


def refusal(response: httpx.Response, text: str) -> Outcome:
    """Permanent, unless the answer carries a Retry-After: a provider that says when to come
    back means "later", not "never", so it is throttled at that time (no attempt spent)."""
    wait = retry_after_of(response)
    return Outcome.throttled(wait, text) if wait is not None else Outcome.permanent(text)


def json_body(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def message_id_of(response: httpx.Response) -> str | None:
    data = json_body(response)
    for name in ("id", "message_id", "messageId", "MessageID", "MessageId"):
        value = data.get(name)
        if value is not None:
            return str(value)
    return None


# -- the generic JSON adapter --------------------------------------------------------------
class JsonHttpProvider(HttpApiProvider):
    """``http(s)://host/path``: a JSON email API that honours ``Idempotency-Key``."""

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        token: Secret | None = None,
        deduplicates: bool = True,
        dedup_window: timedelta | None = timedelta(hours=24),
        utf8: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, **kwargs)
        self.token = token
        self.utf8 = utf8
        """The API takes addresses with a Unicode local part (``utf8=1``)."""
        self.capabilities = Capabilities(
            deduplicates_by_key=deduplicates,
            dedup_window=dedup_window if deduplicates else None,
        )

    @classmethod
    def from_url(cls, url: str, **extra: Any) -> JsonHttpProvider:
        parsed = ProviderURL.parse(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigurationError(f"not an http(s):// URL with a host: {parsed.redacted!r}")
        deduplicates = bool(parsed.flag("dedupe", True))
        window = parsed.number("dedup_window", 86400.0)
        utf8 = bool(parsed.flag("utf8", False))
        kwargs = http_options(parsed)
        token = secret(parsed.password, HTTP_TOKEN_ENV)
        parsed.finish()
        port = f":{parsed.port}" if parsed.port else ""
        endpoint = f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"
        return cls(endpoint, token=token, deduplicates=deduplicates,
                   dedup_window=timedelta(seconds=window) if window else None, utf8=utf8,
                   **kwargs, **extra)

    def headers(self, delivery: Delivery) -> dict[str, str]:
        headers = {"Idempotency-Key": delivery.key, "Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token.reveal()}"
        return headers

    def build_request(self, delivery: Delivery) -> httpx.Request:
        return self.client.build_request(
            "POST", self.base_url,
            json=generic_payload(delivery, self.default_sender, utf8=self.utf8),
            headers=self.headers(delivery),
        )


def generic_payload(delivery: Delivery, default_sender: str | None, *,
                    utf8: bool = False) -> dict[str, Any]:
    """The JSON body. Domains go as A-labels; a Unicode local part only when ``utf8`` (the
    API was declared to take one, ``utf8=1``), else ``InvalidAddress``."""
    sender = sender_of(delivery, default_sender)
    check_delivery(delivery, sender)
    body: dict[str, Any] = {
        "to": wire_address(delivery.recipient, field="to", utf8=utf8, transport=HTTP_NO_UTF8),
        "from": wire_address(sender, field="sender", utf8=utf8, transport=HTTP_NO_UTF8),
        "subject": delivery.subject,
        "text": delivery.text,
        "html": delivery.html,
        "headers": wire_headers(delivery, utf8=utf8, transport=HTTP_NO_UTF8),
        "metadata": {**provider_metadata(delivery), "postlane_key": delivery.key,
                     "postlane_delivery_id": delivery.id},
        "template_id": delivery.template_id,
    }
    if delivery.attachments:
        body["attachments"] = json_attachments(delivery.attachments)
    return body


def http_options(parsed: ProviderURL) -> dict[str, Any]:
    """The options every HTTP adapter takes, consumed from ``parsed``."""
    return {
        "timeout_s": parsed.number("timeout", 10.0, minimum=0.001),
        "connect_timeout_s": parsed.number("connect_timeout", 5.0, minimum=0.001),
        "pool": parsed.integer("pool", 20),
        "default_sender": parsed.text("from"),
        "account": parsed.text("account"),
    }
