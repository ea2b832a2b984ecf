"""One mapping table per adapter: a provider's answer (or its absence) -> an outcome class.

No sockets: HTTP adapters run over ``httpx.MockTransport``, SES over botocore's ``Stubber``,
and SMTP's table is the pure function the adapter uses. An adapter never raises for a
provider's answer, so every row here is a returned ``Outcome``. Where the answer is missing,
the phase the attempt reached decides (transient before the point of no return, ambiguous
after it): those rows name the phase.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import boto3
import httpx
import pytest
from aiosmtplib import (
    SMTPDataError,
    SMTPReadTimeoutError,
    SMTPRecipientRefused,
    SMTPSenderRefused,
    SMTPServerDisconnected,
)
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.stub import ANY, Stubber

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass, Phase
from postlane.core.states import State
from postlane.providers.http import (
    ExchangeTrace,
    HttpApiProvider,
    JsonHttpProvider,
    outcome_of_transport_error,
)
from postlane.providers.mime import key_digest
from postlane.providers.postmark import PostmarkProvider
from postlane.providers.progress import AttemptAbandoned, AttemptProgress
from postlane.providers.resend import ResendProvider
from postlane.providers.sandbox import SandboxAnswer
from postlane.providers.sandbox import outcome_of as sandbox_outcome
from postlane.providers.sandbox_client import SandboxHttpProvider
from postlane.providers.ses import SESConfig, SESProvider, outcome_of_botocore_error
from postlane.providers.smtp import (
    SMTPConfig,
    SMTPProvider,
    _outcome_of_failure,
    _Phase,
    outcome_of_reply,
)
from postlane.worker.attempt import Attempt

A, T, X, P, Y, ACC = (OutcomeClass.ACCEPTED, OutcomeClass.THROTTLED, OutcomeClass.TRANSIENT,
                      OutcomeClass.PERMANENT, OutcomeClass.AMBIGUOUS, OutcomeClass.ACCOUNT)


def delivery(key: str = "reset:42", **changes: Any) -> Delivery:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    fields: dict[str, Any] = dict(
        id=42, key=key, lane="interactive", channel="email", recipient="bob@example.com",
        sender="alice@example.org", subject="Reset your password", text="Follow the link.\n",
        html=None, headers={}, metadata={}, import_id=None, template_id=None,
        template_version=None, state=State.SENDING, attempts=0, claims=1, run_at=now,
        expires_at=None, lease_owner="w", lease_expires_at=None, attempt_started_at=now,
        provider_message_id=None, dead_reason=None, last_error=None, created_at=now,
        updated_at=now, sent_at=None, finished_at=None,
    )
    fields.update(changes)
    return Delivery(**fields)


# == SMTP =================================================================================
@pytest.mark.parametrize(("code", "phase", "kind"), [
    (421, "mail", X), (450, "rcpt", X), (451, "rcpt", X), (452, "rcpt", X), (451, "data", X),
    (550, "rcpt", P), (551, "rcpt", P), (552, "data", P), (553, "mail", P), (554, "data", P),
    (500, "mail", P), (-1, "mail", X), (-1, "data", Y),
    # The login, not the message: the account's trouble wherever the server says it.
    (535, "auth", ACC), (534, "auth", ACC), (530, "mail", ACC), (538, "auth", ACC),
])
def test_smtp_reply_table(code: int, phase: str, kind: OutcomeClass) -> None:
    outcome = outcome_of_reply(code, "text", phase)
    assert outcome.kind is kind
    assert str(code) in (outcome.response or "")


E, D, R = Phase.ENVELOPE, Phase.DATA, Phase.RESPONSE


@pytest.mark.parametrize(("command", "reached", "error", "kind"), [
    ("mail", E, SMTPServerDisconnected("Connection lost"), X),
    ("mail", E, SMTPSenderRefused(451, "try later", "a@b.c"), X),
    ("mail", E, SMTPSenderRefused(553, "no", "a@b.c"), P),
    ("rcpt", E, SMTPRecipientRefused(550, "no such user", "bob@example.com"), P),
    ("rcpt", E, SMTPRecipientRefused(450, "greylisted", "bob@example.com"), X),
    ("rcpt", E, SMTPReadTimeoutError("timed out"), X),
    ("rcpt", E, ConnectionResetError("reset"), X),
    # DATA before the final dot: the server cannot have the message.
    ("data", D, SMTPDataError(451, "local error"), X),
    ("data", D, SMTPDataError(554, "rejected"), P),
    ("data", D, SMTPDataError(250, "250 where 354 was due"), X),
    ("data", D, SMTPServerDisconnected("Connection lost"), X),
    ("data", D, SMTPReadTimeoutError("timed out"), X),
    ("data", D, ConnectionResetError("reset"), X),
    # After the final dot: only an answer decides.
    ("data", R, SMTPDataError(451, "local error"), X),
    ("data", R, SMTPDataError(554, "rejected"), P),
    ("data", R, SMTPDataError(354, "354 where 250 was due"), Y),
    ("data", R, SMTPServerDisconnected("Connection lost"), Y),
    ("data", R, SMTPReadTimeoutError("timed out"), Y),
    ("data", R, ConnectionResetError("reset"), Y),
])
def test_smtp_failure_table(command: str, reached: Phase, error: BaseException,
                            kind: OutcomeClass) -> None:
    outcome = _outcome_of_failure(_Phase(command, error), reached)
    assert outcome.kind is kind
    assert outcome.phase is reached


# == HTTP: the generic JSON adapter =======================================================
Handler = Callable[[httpx.Request], httpx.Response]


async def run_http(provider_cls: type[HttpApiProvider], handler: Handler,
                   item: Delivery | None = None, **kwargs: Any) -> tuple[Outcome, list[Any]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    provider = provider_cls(transport=httpx.MockTransport(record), **kwargs)
    await provider.open()
    try:
        outcome = await provider.send(item or delivery())
    finally:
        await provider.close()
    return outcome, seen


def answer(status: int, body: Any = None, **headers: str) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        content = json.dumps(body).encode() if body is not None else b""
        return httpx.Response(status, content=content, headers=headers)
    return handler


def fail(exc: Exception) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc
    return handler


def http_date(seconds_from_now: int) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds_from_now), usegmt=True)


GENERIC = {"url": "https://api.example.test/v1/send"}


@pytest.mark.parametrize(("handler", "kind", "retry_after"), [
    (answer(200, {"id": "m-1"}), A, None),
    (answer(202, {"message_id": "m-2"}), A, None),
    (answer(429, {"error": "slow"}, **{"Retry-After": "7"}), T, 7.0),
    (answer(429, {"error": "slow"}), T, None),
    (answer(400, {"error": "bad address"}), P, None),
    (answer(404, {"error": "no template"}), P, None),
    (answer(413), P, None),
    (answer(422, {"error": "invalid"}), P, None),
    (answer(401, {"error": "bad token"}), ACC, None),
    (answer(403, {"error": "forbidden"}), ACC, None),
    (answer(401, {"error": "key rotated"}, **{"Retry-After": "30"}), ACC, 30.0),
    (answer(408), X, None),
    (answer(409, {"error": "same key in progress"}), X, None),
    # A 4xx that names a Retry-After means "later": throttled at that time, never dead.
    (answer(400, {"error": "busy"}, **{"Retry-After": "12"}), T, 12.0),
    (answer(409, {"error": "same key in progress"}, **{"Retry-After": "2"}), T, 2.0),
    (answer(422, {"error": "try later"}, **{"Retry-After": "soon"}), P, None),
    (answer(500), X, None),
    (answer(502), X, None),
    (answer(503, None, **{"Retry-After": "3"}), X, 3.0),
    (answer(504), Y, None),
    (answer(302, None, Location="https://elsewhere.test/"), X, None),
    (fail(httpx.ConnectError("refused")), X, None),
    (fail(httpx.ConnectTimeout("connect timeout")), X, None),
    (fail(httpx.PoolTimeout("no connection free")), X, None),
    (fail(httpx.ReadTimeout("read timeout")), Y, None),
    (fail(httpx.WriteTimeout("write timeout")), X, None),
    (fail(httpx.WriteError("broken pipe")), X, None),
    (fail(httpx.ReadError("reset by peer")), Y, None),
    (fail(httpx.RemoteProtocolError("server disconnected")), Y, None),
])
async def test_generic_http_table(handler: Handler, kind: OutcomeClass,
                                  retry_after: float | None) -> None:
    outcome, _ = await run_http(JsonHttpProvider, handler, **GENERIC)
    assert outcome.kind is kind
    assert outcome.retry_after_s == retry_after


@pytest.mark.parametrize(("error", "written", "kind"), [
    # Never left: no connection, or the request was not fully written.
    (httpx.PoolTimeout("no connection free"), None, X),
    (httpx.ConnectError("refused"), False, X),
    (httpx.ConnectTimeout("connect timeout"), False, X),
    (httpx.WriteTimeout("write timeout"), False, X),
    (httpx.WriteError("broken pipe"), False, X),
    # httpcore swallows a write error and reads: the read then fails, body unwritten.
    (httpx.ReadError("reset by peer"), False, X),
    (httpx.ReadTimeout("read timeout"), False, X),
    (httpx.RemoteProtocolError("server disconnected"), False, X),
    # Past the point of no return: the whole request was written.
    (httpx.ReadTimeout("read timeout"), True, Y),
    (httpx.ReadError("reset by peer"), True, Y),
    (httpx.RemoteProtocolError("server disconnected"), True, Y),
    # A transport that does not trace: the exception alone decides.
    (httpx.ReadTimeout("read timeout"), None, Y),
])
def test_http_transport_table_by_phase(error: httpx.HTTPError, written: bool | None,
                                       kind: OutcomeClass) -> None:
    outcome = outcome_of_transport_error(error, written)
    assert outcome.kind is kind
    assert (outcome.response or "").startswith("not sent" if kind is X else "no answer")


async def test_http_trace_moves_the_phase_to_response_only_when_the_body_is_written() -> None:
    progress = AttemptProgress()
    trace = ExchangeTrace(progress)
    steps = [
        ("connection.connect_tcp.started", Phase.CONNECT, False),
        ("connection.connect_tcp.complete", Phase.CONNECT, False),
        ("connection.start_tls.started", Phase.TLS, False),
        ("http11.send_request_headers.started", Phase.REQUEST, False),
        ("http11.send_request_body.started", Phase.REQUEST, False),
        ("http11.send_request_body.complete", Phase.RESPONSE, True),
        ("http11.receive_response_headers.started", Phase.RESPONSE, True),
    ]
    for event, phase, written in steps:
        await trace(event, {})
        assert (progress.phase, trace.written) == (phase, written), event


async def test_http_trace_stops_an_abandoned_request_before_its_body() -> None:
    progress = AttemptProgress()
    trace = ExchangeTrace(progress)
    await trace("http11.send_request_headers.started", {})
    assert progress.abandon() is Phase.REQUEST
    with pytest.raises(AttemptAbandoned):
        await trace("http11.send_request_body.started", {})


@pytest.mark.parametrize(("handler", "phase"), [
    (answer(200, {"id": "m-1"}), Phase.RESPONSE),
    (answer(503), Phase.RESPONSE),
    (fail(httpx.PoolTimeout("no connection free")), Phase.QUEUED),
])
async def test_http_outcomes_name_their_phase(handler: Handler, phase: Phase) -> None:
    outcome, _ = await run_http(JsonHttpProvider, handler, **GENERIC)
    assert outcome.phase is phase


async def test_generic_http_retry_after_as_http_date() -> None:
    outcome, _ = await run_http(
        JsonHttpProvider, answer(429, None, **{"Retry-After": http_date(30)}), **GENERIC)
    assert outcome.kind is T
    assert outcome.retry_after_s is not None and 25 <= outcome.retry_after_s <= 30


async def test_generic_http_request_shape() -> None:
    from postlane.providers.options import Secret

    outcome, seen = await run_http(
        JsonHttpProvider, answer(200, {"id": "m-1"}),
        delivery(headers={"Reply-To": "help@example.org"}, metadata={"user": 7}),
        token=Secret("tok-123"), **GENERIC)
    assert outcome == Outcome.accepted("m-1", '200 {"id": "m-1"}')
    (request,) = seen
    assert request.method == "POST" and str(request.url) == GENERIC["url"]
    assert request.headers["Idempotency-Key"] == "reset:42"
    assert request.headers["Authorization"] == "Bearer tok-123"
    body = json.loads(request.content)
    assert body["to"] == "bob@example.com" and body["from"] == "alice@example.org"
    assert body["subject"] == "Reset your password" and body["text"] == "Follow the link.\n"
    assert body["headers"] == {"Reply-To": "help@example.org", "X-Postlane-Key": "reset:42"}
    assert body["metadata"] == {"user": 7, "postlane_key": "reset:42",
                                "postlane_delivery_id": 42}


# == Postmark =============================================================================
PM = {"token": None, "base_url": "https://pm.example.test"}


@pytest.mark.parametrize(("handler", "kind", "retry_after"), [
    (answer(200, {"ErrorCode": 0, "Message": "OK", "MessageID": "pm-1"}), A, None),
    (answer(422, {"ErrorCode": 300, "Message": "Invalid email request"}), P, None),
    (answer(422, {"ErrorCode": 406, "Message": "Inactive recipient"}), P, None),
    (answer(422, {"ErrorCode": 400, "Message": "Sender signature not found"}), ACC, None),
    (answer(422, {"ErrorCode": 401, "Message": "Sender signature not confirmed"}), ACC, None),
    (answer(422, {"ErrorCode": 300, "Message": "Later"}, **{"Retry-After": "9"}), T, 9.0),
    (answer(422, {"ErrorCode": 412, "Message": "Account pending"}), P, None),
    (answer(422, {"ErrorCode": 405, "Message": "Not allowed to send"}), T, 60.0),
    (answer(422, {"ErrorCode": 100, "Message": "Maintenance"}), X, None),
    (answer(422, {"ErrorCode": 99999, "Message": "something new"}), P, None),
    (answer(401, {"ErrorCode": 10, "Message": "Bad or missing API token"}), ACC, None),
    (answer(422, {"ErrorCode": 10, "Message": "Bad or missing API token"}), ACC, None),
    (answer(403, {"Message": "Forbidden"}), ACC, None),
    (answer(429, {"ErrorCode": 429, "Message": "Rate limit"}, **{"Retry-After": "2"}), T, 2.0),
    (answer(500, {"ErrorCode": 0, "Message": "Internal error"}), X, None),
    (answer(503), X, None),
    (answer(504), Y, None),
    (fail(httpx.ConnectError("refused")), X, None),
    (fail(httpx.ReadTimeout("read timeout")), Y, None),
])
async def test_postmark_table(handler: Handler, kind: OutcomeClass,
                              retry_after: float | None) -> None:
    outcome, _ = await run_http(PostmarkProvider, handler, **PM)
    assert outcome.kind is kind
    assert outcome.retry_after_s == retry_after


async def test_postmark_request_shape() -> None:
    from postlane.providers.options import Secret

    outcome, seen = await run_http(
        PostmarkProvider, answer(200, {"ErrorCode": 0, "MessageID": "pm-1"}),
        delivery(html="<p>x</p>", metadata={"user": 7}), token=Secret("pm-token"),
        base_url="https://pm.example.test", message_stream="outbound")
    assert outcome.kind is A and outcome.provider_message_id == "pm-1"
    (request,) = seen
    assert str(request.url) == "https://pm.example.test/email"
    assert request.headers["X-Postmark-Server-Token"] == "pm-token"
    body = json.loads(request.content)
    assert body["From"] == "alice@example.org" and body["To"] == "bob@example.com"
    assert body["TextBody"] == "Follow the link.\n" and body["HtmlBody"] == "<p>x</p>"
    assert body["MessageStream"] == "outbound"
    assert {"Name": "X-Postlane-Key", "Value": "reset:42"} in body["Headers"]
    assert body["Metadata"] == {"user": "7", "postlane_key": "reset:42",
                                "postlane_delivery_id": "42"}


# == Resend ===============================================================================
RS = {"token": None, "base_url": "https://rs.example.test"}


def resend_error(status: int, name: str, **headers: str) -> Handler:
    return answer(status, {"statusCode": status, "name": name, "message": name}, **headers)


@pytest.mark.parametrize(("handler", "kind", "retry_after"), [
    (answer(200, {"id": "rs-1"}), A, None),
    (resend_error(400, "invalid_idempotency_key"), P, None),
    (resend_error(400, "validation_error"), P, None),
    (resend_error(401, "missing_api_key"), ACC, None),
    (resend_error(401, "validation_error"), ACC, None),
    (resend_error(403, "invalid_api_key"), ACC, None),
    (resend_error(403, "restricted_api_key"), ACC, None),
    (resend_error(403, "validation_error"), P, None),
    (answer(403, {"statusCode": 403, "name": "validation_error", "message":
                  "The example.org domain is not verified. Please, add and verify your "
                  "domain on https://resend.com/domains"}), ACC, None),
    (answer(403, {"statusCode": 403, "name": "validation_error", "message":
                  "You can only send testing emails to your own email address"}), ACC, None),
    (resend_error(422, "validation_error", **{"Retry-After": "4"}), T, 4.0),
    (resend_error(404, "not_found"), P, None),
    (resend_error(409, "concurrent_idempotent_requests"), X, None),
    (resend_error(409, "invalid_idempotent_request"), P, None),
    (resend_error(422, "missing_required_field"), P, None),
    (resend_error(422, "invalid_from_address"), P, None),
    (resend_error(429, "rate_limit_exceeded", **{"Retry-After": "1"}), T, 1.0),
    (resend_error(429, "daily_quota_exceeded"), T, 300.0),
    (resend_error(429, "monthly_quota_exceeded", **{"Retry-After": "3600"}), T, 3600.0),
    (resend_error(500, "application_error"), X, None),
    (resend_error(500, "internal_server_error"), X, None),
    (answer(502), X, None),
    (answer(504), Y, None),
    (fail(httpx.ConnectTimeout("connect timeout")), X, None),
    (fail(httpx.ReadTimeout("read timeout")), Y, None),
])
async def test_resend_table(handler: Handler, kind: OutcomeClass,
                            retry_after: float | None) -> None:
    outcome, _ = await run_http(ResendProvider, handler, **RS)
    assert outcome.kind is kind
    assert outcome.retry_after_s == retry_after


async def test_resend_request_shape() -> None:
    from postlane.providers.options import Secret

    outcome, seen = await run_http(ResendProvider, answer(200, {"id": "rs-1"}),
                                   token=Secret("re_123"), base_url="https://rs.example.test")
    assert outcome.kind is A and outcome.provider_message_id == "rs-1"
    (request,) = seen
    assert str(request.url) == "https://rs.example.test/emails"
    assert request.headers["Authorization"] == "Bearer re_123"
    assert request.headers["Idempotency-Key"] == "reset:42"
    body = json.loads(request.content)
    assert body["to"] == ["bob@example.com"] and body["headers"]["X-Postlane-Key"] == "reset:42"
    assert {"name": "postlane_key_sha256", "value": key_digest("reset:42")} in body["tags"]
    assert ResendProvider.capabilities.deduplicates_by_key
    assert ResendProvider.capabilities.dedup_window == timedelta(hours=24)


# == the sandbox over HTTP ================================================================
SB = {"base_url": "http://sandbox.test:8025"}


@pytest.mark.parametrize(("handler", "kind", "retry_after"), [
    (answer(200, {"id": "sbx-1"}), A, None),
    (answer(200, {"id": "sbx-1", "duplicate": True}), A, None),
    (answer(429, {"error": "rate limit exceeded"}, **{"Retry-After": "0.250"}), T, 0.25),
    (answer(503, {"error": "service unavailable"}), X, None),
    (answer(400, {"error": "recipient rejected"}), P, None),
    (answer(404, {"error": "unknown template"}), P, None),
    (answer(400, {"error": "busy"}, **{"Retry-After": "5"}), T, 5.0),
    (answer(401, {"error": "bad key"}), ACC, None),
    (fail(httpx.ReadTimeout("accepted, then no answer")), Y, None),
    (fail(httpx.ConnectError("refused")), X, None),
])
async def test_sandbox_http_table(handler: Handler, kind: OutcomeClass,
                                  retry_after: float | None) -> None:
    outcome, _ = await run_http(SandboxHttpProvider, handler, **SB)
    assert outcome.kind is kind
    assert outcome.retry_after_s == retry_after


@pytest.mark.parametrize(("handler", "expected"), [
    (answer(200, {"id": "sbx-9", "key": "a/b:c"}), "accepted"),
    (answer(404, {"error": "unknown key"}), None),
    (answer(500), "transient"),
    (fail(httpx.ConnectError("refused")), "transient"),
])
async def test_sandbox_http_lookup(handler: Handler, expected: str | None) -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    provider = SandboxHttpProvider(transport=httpx.MockTransport(record), **SB)
    await provider.open()
    try:
        found = await provider.lookup("a/b:c")
    finally:
        await provider.close()
    assert (found.kind.value if found else None) == expected
    assert seen and seen[0].url.raw_path == b"/v1/messages/a%2Fb%3Ac"


# == every adapter refuses header injection without sending ===============================
@pytest.mark.parametrize("provider_cls, kwargs", [
    (JsonHttpProvider, GENERIC), (PostmarkProvider, PM), (ResendProvider, RS),
    (SandboxHttpProvider, SB),
])
@pytest.mark.parametrize("bad", [
    {"headers": {"X-Evil": "a\r\nBcc: victim@example.com"}},
    {"subject": "hi\nBcc: victim@example.com"},
    {"recipient": "bob@example.com\r\nRCPT TO:<x@y.z>"},
    {"headers": {"Content-Type": "text/html"}},
])
async def test_http_adapters_refuse_bad_headers_before_sending(
    provider_cls: type[HttpApiProvider], kwargs: dict[str, Any], bad: dict[str, Any],
) -> None:
    outcome, seen = await run_http(provider_cls, answer(200, {"id": "x"}), delivery(**bad),
                                   **kwargs)
    assert outcome.kind is P and "refused before sending" in (outcome.response or "")
    assert seen == []


# == SES ==================================================================================
@pytest.fixture(scope="module")
def ses_client() -> Any:
    """One botocore client for the module (building one costs a third of a second)."""
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="eu-west-1",
    ).client("sesv2")


@pytest.fixture
def ses(ses_client: Any) -> Iterator[tuple[Callable[..., SESProvider], Stubber]]:
    stubber = Stubber(ses_client)
    stubber.activate()

    def make(**config: Any) -> SESProvider:
        settings: dict[str, Any] = {"region": "eu-west-1", **config}
        return SESProvider(SESConfig(**settings), client=ses_client)

    yield make, stubber
    stubber.deactivate()


@pytest.mark.parametrize(("code", "status", "kind", "retry_after"), [
    ("TooManyRequestsException", 429, T, None),
    ("Throttling", 400, T, None),
    ("ThrottlingException", 400, T, None),
    ("LimitExceededException", 400, T, 60.0),
    ("SendingPausedException", 400, T, 60.0),
    ("AccountSendingPausedException", 400, T, 60.0),
    ("ConfigurationSetSendingPausedException", 400, T, 60.0),
    ("AccountSuspendedException", 400, ACC, None),
    ("UnrecognizedClientException", 403, ACC, None),
    ("AccessDeniedException", 403, ACC, None),
    ("SignatureDoesNotMatch", 403, ACC, None),
    ("MessageRejected", 400, P, None),
    ("MailFromDomainNotVerifiedException", 400, ACC, None),
    ("BadRequestException", 400, P, None),
    ("NotFoundException", 404, P, None),
    ("InternalServiceErrorException", 500, X, None),
    ("ServiceUnavailable", 503, X, None),
    ("SomethingNew", 500, X, None),
    ("SomethingNew", 429, T, None),
    ("SomethingNew", 400, P, None),
    ("SomethingNew", 504, Y, None),
])
async def test_ses_error_table(ses: Any, code: str, status: int, kind: OutcomeClass,
                               retry_after: float | None) -> None:
    make, stubber = ses
    provider = make()
    stubber.add_client_error("send_email", service_error_code=code, service_message="m",
                             http_status_code=status)
    await provider.open()
    try:
        outcome = await provider.send(delivery())
    finally:
        await provider.close()
    assert outcome.kind is kind
    assert outcome.retry_after_s == retry_after
    assert code in (outcome.response or "")


@pytest.mark.parametrize(("message", "kind"), [
    ("Email address is not verified. The following identities failed the check in region "
     "EU-WEST-1: alice@example.org", ACC),
    ("User `arn:aws:iam::123:user/x' is not authorized to send from `example.org'", ACC),
    ("Sender alice@example.org did not have authority to send from example.org", ACC),
    ("Illegal address", P),
])
async def test_ses_message_rejected_reads_the_message(ses: Any, message: str,
                                                      kind: OutcomeClass) -> None:
    """An unverified sender identity is the account's set-up; other rejections are the
    message's."""
    make, stubber = ses
    provider = make()
    stubber.add_client_error("send_email", service_error_code="MessageRejected",
                             service_message=message, http_status_code=400)
    await provider.open()
    try:
        outcome = await provider.send(delivery())
    finally:
        await provider.close()
    assert outcome.kind is kind


async def test_ses_refusal_with_retry_after_is_throttled(ses: Any) -> None:
    make, stubber = ses
    provider = make()
    stubber.add_client_error("send_email", service_error_code="BadRequestException",
                             service_message="later", http_status_code=400,
                             response_meta={"HTTPHeaders": {"retry-after": "8"}})
    await provider.open()
    try:
        outcome = await provider.send(delivery())
    finally:
        await provider.close()
    assert (outcome.kind, outcome.retry_after_s) == (T, 8.0)


@pytest.mark.parametrize(("error", "kind"), [
    (ReadTimeoutError(endpoint_url="https://email.eu-west-1.amazonaws.com"), Y),
    (ConnectionClosedError(endpoint_url="https://email.eu-west-1.amazonaws.com"), Y),
    (ConnectTimeoutError(endpoint_url="https://email.eu-west-1.amazonaws.com"), X),
    (EndpointConnectionError(endpoint_url="https://email.eu-west-1.amazonaws.com"), X),
    (NoCredentialsError(), ACC),
    (ParamValidationError(report="bad"), P),
])
def test_ses_transport_table(error: Exception, kind: OutcomeClass) -> None:
    assert outcome_of_botocore_error(error).kind is kind  # type: ignore[arg-type]


@pytest.mark.parametrize(("error", "kind"), [
    (ReadTimeoutError(endpoint_url="https://email.eu-west-1.amazonaws.com"), X),
    (ConnectionClosedError(endpoint_url="https://email.eu-west-1.amazonaws.com"), X),
    (ConnectTimeoutError(endpoint_url="https://email.eu-west-1.amazonaws.com"), X),
    (ParamValidationError(report="bad"), P),
])
def test_ses_failures_before_the_http_exchange_are_never_ambiguous(
        error: Exception, kind: OutcomeClass) -> None:
    outcome = outcome_of_botocore_error(error, sent=False)  # type: ignore[arg-type]
    assert outcome.kind is kind


async def test_ses_deadline_while_waiting_for_a_thread_is_transient_and_never_sends(
        ses: Any) -> None:
    """pool=1 and the one thread busy: a second send waits in the executor's queue. Cut
    off there by the worker's deadline, it is transient, and it never runs."""
    make, stubber = ses
    provider = make(pool=1)
    calls: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def block_first(params: dict[str, Any], **_: Any) -> None:
        calls.append(params["EmailTags"][0]["Value"])
        if not entered.is_set():
            entered.set()
            release.wait(10)

    stubber.add_response("send_email", {"MessageId": "ses-1"})
    stubber.add_response("send_email", {"MessageId": "ses-3"})
    provider._client.meta.events.register(  # type: ignore[union-attr]
        "before-parameter-build.sesv2.SendEmail", block_first, unique_id="test-block")
    await provider.open()
    try:
        first = asyncio.create_task(provider.send(delivery(id=1)))
        await asyncio.to_thread(entered.wait, 10)
        cut_off = await Attempt(provider, delivery(id=2), 0.05).run()
        assert (cut_off.kind, cut_off.phase) == (X, Phase.QUEUED)
        release.set()
        assert (await first).provider_message_id == "ses-1"
        # FIFO pool of one: once a later send is through, the cut-off one was skipped.
        assert (await provider.send(delivery(id=3))).provider_message_id == "ses-3"
    finally:
        release.set()
        provider._client.meta.events.unregister(  # type: ignore[union-attr]
            "before-parameter-build.sesv2.SendEmail", unique_id="test-block")
        await provider.close()
    assert calls == ["1", "3"]
    stubber.assert_no_pending_responses()


async def test_ses_request_carries_configuration_set_tags_and_key(ses: Any) -> None:
    make, stubber = ses
    provider = make(configuration_set="postlane-events")
    stubber.add_response("send_email", {"MessageId": "ses-1"}, {
        "FromEmailAddress": "alice@example.org",
        "Destination": {"ToAddresses": ["bob@example.com"]},
        "Content": {"Raw": {"Data": ANY}},
        "EmailTags": [{"Name": "postlane_delivery_id", "Value": "42"},
                      {"Name": "postlane_key_sha256", "Value": key_digest("reset:42")}],
        "ConfigurationSetName": "postlane-events",
    })
    await provider.open()
    try:
        outcome = await provider.send(delivery())
    finally:
        await provider.close()
    assert outcome.kind is A and outcome.provider_message_id == "ses-1"
    stubber.assert_no_pending_responses()
    raw = provider.request_of(delivery())["Content"]["Raw"]["Data"]
    assert b"X-Postlane-Key: reset:42\r\n" in raw


async def test_ses_refuses_header_injection_without_calling(ses: Any) -> None:
    make, stubber = ses
    provider = make()
    await provider.open()
    try:
        outcome = await provider.send(delivery(headers={"X-A": "1\r\nBcc: x@y.z"}))
    finally:
        await provider.close()
    assert outcome.kind is P
    stubber.assert_no_pending_responses()


# == no sender anywhere: the deployment's set-up, not the message =======================
@pytest.mark.parametrize("provider_cls, kwargs", [
    (JsonHttpProvider, GENERIC), (PostmarkProvider, PM), (ResendProvider, RS),
])  # the sandbox asks for no sender
async def test_http_adapters_answer_account_without_a_sender(
    provider_cls: type[HttpApiProvider], kwargs: dict[str, Any],
) -> None:
    outcome, seen = await run_http(provider_cls, answer(200, {"id": "x"}),
                                   delivery(sender=None), **kwargs)
    assert outcome.kind is ACC and "no sender" in (outcome.response or "")
    assert seen == []


async def test_a_default_sender_is_used_when_the_message_has_none() -> None:
    outcome, seen = await run_http(JsonHttpProvider, answer(200, {"id": "x"}),
                                   delivery(sender=None), default_sender="ops@example.org",
                                   **GENERIC)
    assert outcome.kind is A and json.loads(seen[0].content)["from"] == "ops@example.org"


async def test_ses_and_smtp_answer_account_without_a_sender(ses: Any) -> None:
    make, stubber = ses
    provider = make()
    await provider.open()
    try:
        outcome = await provider.send(delivery(sender=None))
    finally:
        await provider.close()
    assert outcome.kind is ACC
    stubber.assert_no_pending_responses()
    smtp = SMTPProvider(SMTPConfig(host="127.0.0.1", port=9))  # never connected
    assert (await smtp.send(delivery(sender=None))).kind is ACC
    assert smtp.connections_opened == 0


# == the in-process sandbox ===============================================================
@pytest.mark.parametrize(("answer_", "kind", "retry_after"), [
    (SandboxAnswer(200, {"id": "sbx-1"}), A, None),
    (SandboxAnswer(429, {"error": "slow"}, retry_after_s=0.5), T, 0.5),
    (SandboxAnswer(400, {"error": "busy"}, retry_after_s=3.0), T, 3.0),
    (SandboxAnswer(400, {"error": "recipient rejected"}), P, None),
    (SandboxAnswer(401, {"error": "bad key"}), ACC, None),
    (SandboxAnswer(503, {"error": "down"}), X, None),
])
def test_sandbox_table(answer_: SandboxAnswer, kind: OutcomeClass,
                       retry_after: float | None) -> None:
    outcome = sandbox_outcome(answer_)
    assert (outcome.kind, outcome.retry_after_s) == (kind, retry_after)
