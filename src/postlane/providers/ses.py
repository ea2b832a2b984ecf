"""Amazon SES v2 ``SendEmail`` through boto3, in a thread pool of its own:
``ses://eu-west-1?configuration_set=X&from=noreply@example.com`` (``endpoint_url=`` for a
local server such as moto). Credentials: ``ses://KEY_ID:SECRET@region`` or boto3's usual
chain (``AWS_ACCESS_KEY_ID``..., a profile, an instance role).

The message goes as Raw MIME built by ``postlane.providers.mime``, so it carries the same
deterministic ``Message-ID`` and ``X-Postlane-Key`` header as over SMTP. The configuration
set (for SES event publishing) and two EmailTags -- ``postlane_delivery_id`` and
``postlane_key_sha256`` (tag values allow only ``[A-Za-z0-9_-]``, so the key goes hashed) --
let SES events be joined back to the delivery.

botocore's own retries are switched off: a retry after a read timeout would send a second
copy, and SES has no idempotency key. The worker's policy decides every retry.

Mapping (error code first, then HTTP status):

    TooManyRequestsException, Throttling(Exception)      throttled
    LimitExceededException (a sending quota)             throttled, account_retry_after
    SendingPausedException, AccountSendingPaused...,
    ConfigurationSetSendingPausedException               throttled, account_retry_after
    AccountSuspendedException, credential errors,        account: the breaker opens at once,
    MailFromDomainNotVerifiedException, MessageRejected  the deliveries wait unspent
    saying "not verified" / "did not have authority"
    (an unverified sender identity), no credentials
    other MessageRejected, BadRequestException,
    NotFoundException, other 4xx                         permanent
    5xx (InternalServiceError, ServiceUnavailable...)    transient
    connect timeout, connection refused, TLS failure     transient (never left)
    read timeout, connection closed mid-exchange         ambiguous
    any failure before botocore began the HTTP exchange  transient (never left)
    an address with a Unicode local part (SES has no
      SMTPUTF8; nothing is sent)                         permanent

Phases (``postlane.core.outcomes.Phase``): queued while the call waits for a thread of the
pool (cancelled there, it never runs), request while botocore builds and signs it, connects
and writes the request, response once the request's last bytes are handed to the socket.
botocore does not say when a request is fully written, so at its ``before-send`` event the
body is wrapped in a reader (``_MarksLastChunk``) that reports the point of no return just
before it returns the body's final bytes to the HTTP layer: an attempt deadline while SES is
slow to accept the connection, the TLS handshake or the body is transient, like botocore's
own connect timeout.

Sending paused is an account state, not a verdict on the message: retrying later may work,
and dead-lettering every queued message for it would empty the queue. It is *throttled*
(no attempt spent) with ``account_retry_after`` seconds (default 60), which also closes the
shared rate-limit gate for the account, so the fleet asks SES again about once a minute
instead of once per message.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from postlane.core.addresses import wire_address
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass, Phase
from postlane.core.policy import parse_retry_after
from postlane.errors import ConfigurationError, InvalidMessage
from postlane.extras import requires
from postlane.limiter.auto import AccountLimits
from postlane.providers.base import Capabilities, Provider, refused_before_sending
from postlane.providers.mime import build_email, key_digest, sender_of
from postlane.providers.options import ProviderURL, Secret
from postlane.providers.progress import AttemptProgress, current_progress, in_context

with requires("ses", "the SES provider"):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )

if TYPE_CHECKING:
    from mypy_boto3_sesv2 import SESV2Client
else:
    SESV2Client = Any

ERROR_CODES: dict[str, OutcomeClass] = {
    "TooManyRequestsException": OutcomeClass.THROTTLED,
    "Throttling": OutcomeClass.THROTTLED,
    "ThrottlingException": OutcomeClass.THROTTLED,
    "LimitExceededException": OutcomeClass.THROTTLED,
    "SendingPausedException": OutcomeClass.THROTTLED,
    "AccountSendingPausedException": OutcomeClass.THROTTLED,
    "ConfigurationSetSendingPausedException": OutcomeClass.THROTTLED,
    "AccountSuspendedException": OutcomeClass.ACCOUNT,
    "AccessDeniedException": OutcomeClass.ACCOUNT,
    "UnrecognizedClientException": OutcomeClass.ACCOUNT,
    "InvalidClientTokenId": OutcomeClass.ACCOUNT,
    "SignatureDoesNotMatch": OutcomeClass.ACCOUNT,
    "ExpiredToken": OutcomeClass.ACCOUNT,
    "ExpiredTokenException": OutcomeClass.ACCOUNT,
    "MessageRejected": OutcomeClass.PERMANENT,
    "MailFromDomainNotVerifiedException": OutcomeClass.ACCOUNT,
    "BadRequestException": OutcomeClass.PERMANENT,
    "NotFoundException": OutcomeClass.PERMANENT,
    "InvalidParameterValue": OutcomeClass.PERMANENT,
}
_UNVERIFIED = ("not verified", "did not have authority", "not authorized to send")
"""Words of a ``MessageRejected`` about the sending identity (the account's set-up), not the
message: "Email address is not verified", "...did not have authority to send from...".
An SES account in the sandbox also answers "not verified" for an unverified *recipient*:
account-level too (it ends when the account leaves the sandbox), never the message's."""
SES_NO_UTF8 = "Amazon SES does not support SMTPUTF8 (its addresses must be 7-bit ASCII)"
"""SES's API reference (``Destination``): no SMTPUTF8; a Unicode domain must be punycode
(done here), and punycode is not permitted in the local part."""
_ACCOUNT_STOPS = frozenset({
    "LimitExceededException", "SendingPausedException", "AccountSendingPausedException",
    "ConfigurationSetSendingPausedException",
})


@dataclass(frozen=True)
class SESConfig:
    region: str
    endpoint_url: str | None = None
    configuration_set: str | None = None
    default_sender: str | None = None
    access_key_id: str | None = None
    secret_access_key: Secret | None = None
    pool: int = 10
    timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    account_retry_after_s: float = 60.0
    account: str | None = None

    def __repr__(self) -> str:
        return (f"SESConfig(region={self.region!r}, endpoint_url={self.endpoint_url!r}, "
                f"configuration_set={self.configuration_set!r}, pool={self.pool})")

    @classmethod
    def from_url(cls, url: str) -> SESConfig:
        parsed = ProviderURL.parse(url)
        if parsed.scheme != "ses":
            raise ConfigurationError(f"not an ses:// URL: {parsed.redacted!r}")
        region = (parsed.host or os.environ.get("AWS_REGION")
                  or os.environ.get("AWS_DEFAULT_REGION"))
        if not region:
            raise ConfigurationError("ses:// needs a region: ses://eu-west-1 (or AWS_REGION)")
        if parsed.username and not parsed.password:
            raise ConfigurationError("ses://KEY_ID:SECRET@region needs both parts")
        config = cls(
            region=region,
            endpoint_url=parsed.text("endpoint_url"),
            configuration_set=parsed.text("configuration_set"),
            default_sender=parsed.text("from"),
            access_key_id=parsed.username,
            secret_access_key=Secret(parsed.password) if parsed.password else None,
            pool=parsed.integer("pool", 10),
            timeout_s=parsed.number("timeout", 10.0, minimum=0.001),
            connect_timeout_s=parsed.number("connect_timeout", 5.0, minimum=0.001),
            account_retry_after_s=parsed.number("account_retry_after", 60.0),
            account=parsed.text("account"),
        )
        parsed.finish()
        return config


class SESProvider(Provider):
    name = "ses"
    capabilities = Capabilities()  # no idempotency key, no lookup by our key
    needs_sender = True

    def configured_sender(self) -> str | None:
        return self.config.default_sender

    def endpoint(self) -> tuple[str, int] | None:
        if self.config.endpoint_url is None:
            return f"email.{self.config.region}.amazonaws.com", 443
        url = urlsplit(self.config.endpoint_url)
        return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)

    def __init__(self, config: SESConfig, *, client: SESV2Client | None = None) -> None:
        self.config = config
        self._client = client
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_url(cls, url: str) -> SESProvider:
        return cls(SESConfig.from_url(url))

    def __repr__(self) -> str:
        return f"SESProvider({self.config!r})"

    @property
    def account(self) -> str:
        return self.config.account or f"ses:{self.config.region}"

    async def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.config.pool,
                                                thread_name_prefix="postlane-ses")
        if self._client is None:
            self._client = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._make_client)

    async def close(self) -> None:
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False, cancel_futures=True)

    def _make_client(self) -> SESV2Client:
        config = self.config
        session = boto3.session.Session(
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=(config.secret_access_key.reveal()
                                   if config.secret_access_key else None),
            region_name=config.region,
        )
        return session.client(
            "sesv2",
            endpoint_url=config.endpoint_url,
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=config.connect_timeout_s,
                read_timeout=config.timeout_s,
                max_pool_connections=config.pool,
            ),
        )

    def request_of(self, delivery: Delivery) -> dict[str, Any]:
        """The ``SendEmail`` arguments; raises ``InvalidMessage`` for what cannot be sent."""
        sender = sender_of(delivery, self.config.default_sender)
        raw = build_email(delivery, sender, transport=SES_NO_UTF8).as_bytes()
        request: dict[str, Any] = {
            "FromEmailAddress": wire_address(sender, field="sender", utf8=False,
                                             transport=SES_NO_UTF8),
            "Destination": {"ToAddresses": [wire_address(
                delivery.recipient, field="to", utf8=False, transport=SES_NO_UTF8)]},
            "Content": {"Raw": {"Data": raw}},
            "EmailTags": [
                {"Name": "postlane_delivery_id", "Value": str(delivery.id)},
                {"Name": "postlane_key_sha256", "Value": key_digest(delivery.key)},
            ],
        }
        if self.config.configuration_set:
            request["ConfigurationSetName"] = self.config.configuration_set
        return request

    async def send(self, delivery: Delivery) -> Outcome:
        try:
            request = self.request_of(delivery)
        except InvalidMessage as exc:
            return refused_before_sending(exc)
        if self._client is None or self._executor is None:
            await self.open()
        assert self._client is not None
        _watch_sending(self._client)
        progress = current_progress()
        progress.reach(Phase.QUEUED)
        call = in_context(progress, partial(_send_email, progress, self._client, request))
        try:
            answer = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except ClientError as exc:
            return outcome_of_client_error(exc, self.config.account_retry_after_s).at(
                Phase.RESPONSE)
        except BotoCoreError as exc:
            sent = progress.phase is Phase.RESPONSE
            return outcome_of_botocore_error(exc, sent=sent).at(progress.phase)
        message_id = answer.get("MessageId")
        return Outcome.accepted(message_id, f"MessageId {message_id}").at(Phase.RESPONSE)


    async def account_limits(self) -> AccountLimits:
        """SESv2 ``GetAccount``'s ``SendQuota``: MaxSendRate, Max24HourSend (-1: unlimited)
        and SentLast24Hours. Raises what botocore raises: the caller decides (a start refuses,
        a refresh keeps the last limits)."""
        if self._client is None or self._executor is None:
            await self.open()
        assert self._client is not None
        answer = await asyncio.get_running_loop().run_in_executor(
            self._executor, self._client.get_account)
        quota = answer.get("SendQuota") or {}
        rate = quota.get("MaxSendRate")
        daily = quota.get("Max24HourSend")
        sent = quota.get("SentLast24Hours")
        return AccountLimits(
            max_send_rate=float(rate) if rate is not None and rate > 0 else None,
            max_24h_send=int(daily) if daily is not None and daily > 0 else None,
            sent_last_24h=int(sent) if sent is not None else None,
        )


def _send_email(progress: AttemptProgress, client: SESV2Client,
                request: dict[str, Any]) -> Any:
    """In the pool's thread: raises ``AttemptAbandoned`` instead of sending when the
    worker gave up while the call waited for a thread."""
    progress.reach(Phase.REQUEST)
    return client.send_email(**request)


def _before_send(request: Any = None, **_: Any) -> None:
    """botocore is about to connect and write the request: the point of no return is its
    last byte, which ``_MarksLastChunk`` reports (the thread runs in the attempt's context,
    see ``in_context``). A request without a body in bytes is past it from here."""
    progress = current_progress()
    body = getattr(request, "body", None)
    if isinstance(body, bytes | bytearray) and body:
        request.body = _MarksLastChunk(bytes(body), progress)
    else:
        progress.reach(Phase.RESPONSE)


class _MarksLastChunk:
    """A request body that reports ``Phase.RESPONSE`` just before handing over its last bytes.

    The HTTP layer reads a body like this one block at a time and writes each block before
    reading the next, so everything returned before the last block is on its way while the
    message is still incomplete for SES. Seekable, because botocore rewinds a body it resends.
    """

    def __init__(self, data: bytes, progress: AttemptProgress) -> None:
        self._data = data
        self._progress = progress
        self._at = 0

    def __len__(self) -> int:
        return len(self._data)

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else min(len(self._data),
                                                                    self._at + size)
        if end == len(self._data) and self._at < end:
            self._progress.reach(Phase.RESPONSE)  # raises if the worker gave up
        chunk = self._data[self._at:end]
        self._at = end
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._at, 2: len(self._data)}[whence]
        self._at = max(0, min(len(self._data), base + offset))
        return self._at

    def tell(self) -> int:
        return self._at


def _watch_sending(client: SESV2Client) -> None:
    client.meta.events.register("before-send.sesv2.SendEmail", _before_send,
                                unique_id="postlane-attempt-progress")


def outcome_of_client_error(exc: ClientError, account_retry_after_s: float = 60.0) -> Outcome:
    """SES answered with an error: its code decides, then its HTTP status."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    text = f"{status} {code}: {error.get('Message', '')}".strip()
    kind = ERROR_CODES.get(code)
    if code == "MessageRejected" and any(
            words in str(error.get("Message", "")).lower() for words in _UNVERIFIED):
        kind = OutcomeClass.ACCOUNT
    if kind is None:
        if status == 429:
            kind = OutcomeClass.THROTTLED
        elif status == 504:
            kind = OutcomeClass.AMBIGUOUS
        elif status >= 500 or status == 0:
            kind = OutcomeClass.TRANSIENT
        else:
            kind = OutcomeClass.PERMANENT
    if kind is OutcomeClass.THROTTLED:
        wait = account_retry_after_s if code in _ACCOUNT_STOPS else None
        return Outcome.throttled(wait, text)
    if kind is OutcomeClass.PERMANENT:  # a refusal that says when to come back is "later"
        headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        wait = parse_retry_after(headers.get("retry-after"), datetime.now(UTC))
        if wait is not None:
            return Outcome.throttled(wait, text)
    return Outcome(kind, response=text)


def outcome_of_botocore_error(exc: BotoCoreError, *, sent: bool = True) -> Outcome:
    """No answer from SES: did the request leave? ``sent`` False: botocore never began the
    HTTP exchange, so nothing can be ambiguous."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, BotoConnectionError):  # connect timeout, refused, TLS, proxy
        return Outcome.transient(f"not sent: {text}")
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return Outcome.account(f"not sent: {text}")
    if isinstance(exc, ParamValidationError):
        return Outcome.permanent(f"refused before sending: {text}")
    if not sent:
        return Outcome.transient(f"not sent: failed before the HTTP exchange: {text}")
    if isinstance(exc, HTTPClientError):  # read timeout, connection closed mid-exchange
        return Outcome.ambiguous(f"no answer after the request left: {text}")
    return Outcome.ambiguous(f"unexpected failure around the request: {text}")
