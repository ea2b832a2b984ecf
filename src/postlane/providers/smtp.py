"""SMTP to any server: ``smtp://user:pass@host:587?starttls=1&pool=4``, ``smtps://...``.

One delivery is one transaction with one recipient (MAIL, RCPT, DATA), over a connection
taken from a small pool and returned for the next transaction when it ended cleanly.

Mapping (the phase matters more than the code: SMTP tells us where we are):

    connect, greeting, EHLO, STARTTLS fail or stall; refused       transient
    AUTH refused (535, 534, 530...), 530 "authentication required"
    at any phase; no STARTTLS offered while credentials need it    account (the breaker
                                                                   opens; nothing spent)
    no answer to AUTH (dropped, timed out)                         transient
    dropped or timed out at MAIL, RCPT, DATA (before the 354),
      or while the message is handed over, before the final dot    transient
    421, 450, 451, 452 (and any 4xx) at MAIL, RCPT, DATA, or "."   transient
    550-554 (and any 5xx) at MAIL, RCPT, DATA, or "."              permanent
    a rejected RCPT (one recipient per delivery, so: the message)  permanent
    connection lost or timeout after the final "." was written     ambiguous
    250 after the final "."                                        accepted
    an address with a Unicode local part, and the server does not
      offer SMTPUTF8 (nothing is sent)                             permanent

The point of no return is the final dot of DATA handed to the connection: a server
cannot accept a message before it has the dot. DATA is therefore sent in two halves
(``_data``): the command and its 354, then the message with its dot, so the adapter knows
which half failed. The phases it reports (``postlane.core.outcomes.Phase``): queued (a pool
slot), connect (TCP, smtps TLS and the 220 greeting: one call in aiosmtplib), hello, tls,
auth, envelope (MAIL, RCPT), data (DATA until the dot), response (after the dot). Each is
reported to the worker's ``AttemptProgress`` so a deadline in any of them is classified the
same way. BDAT (CHUNKING) is not used; aiosmtplib does not offer it.

International addresses (``postlane.core.addresses``): domains go as A-labels always; an
address with a Unicode local part goes with ``SMTPUTF8`` (MAIL FROM, UTF-8 on the command
lines, an RFC 6532 message) when the server offers it, and is refused as permanent when it
does not. Only such a message uses SMTPUTF8; every other one is 7-bit (RFC 2047 headers,
quoted-printable or base64 bodies), which any next hop accepts.

Options: ``starttls=1`` (require) / ``starttls=0`` (never; default: if offered, and
required when credentials are configured), ``allow_plain_auth=1`` (with ``starttls=0``:
send credentials over a connection without TLS, to a relay on a trusted link),
``tls_verify=0``, ``ca_file=PATH``, ``pool=4`` (connections), ``timeout=10`` (seconds per
command), ``max_per_connection=100``, ``idle_timeout=30``, ``helo=NAME``, ``from=ADDR``
(default sender), ``account=NAME``. Credentials: in the URL, else
``POSTLANE_SMTP_USERNAME`` / ``POSTLANE_SMTP_PASSWORD``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from dataclasses import dataclass

from postlane.core.addresses import has_unicode_local, wire_address
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass, Phase
from postlane.errors import ConfigurationError, InvalidMessage
from postlane.extras import requires
from postlane.providers.base import Capabilities, Provider, refused_before_sending
from postlane.providers.mime import NO_UTF8, build_email, message_id, sender_of
from postlane.providers.options import ProviderURL, Secret, secret
from postlane.providers.progress import AttemptProgress, current_progress

with requires("smtp", "the SMTP provider"):
    import aiosmtplib
    from aiosmtplib import (
        SMTPAuthenticationError,
        SMTPDataError,
        SMTPException,
        SMTPHeloError,
        SMTPRecipientRefused,
        SMTPResponseException,
        SMTPSenderRefused,
        SMTPServerDisconnected,
        SMTPStatus,
        SMTPTimeoutError,
    )
    from aiosmtplib.protocol import PERIOD_REGEX, normalize_message_line_endings

NO_SMTPUTF8 = ("an address's local part is not ASCII (an internationalized address, RFC 6531) "
               "and the SMTP server does not offer SMTPUTF8 to carry it; it has no ASCII "
               "form, so nothing was sent")
USERNAME_ENV = "POSTLANE_SMTP_USERNAME"
PASSWORD_ENV = "POSTLANE_SMTP_PASSWORD"


@dataclass(frozen=True)
class SMTPConfig:
    host: str
    port: int
    use_tls: bool = False
    starttls: bool | None = None
    tls_verify: bool = True
    ca_file: str | None = None
    username: str | None = None
    password: Secret | None = None
    pool: int = 4
    timeout_s: float = 10.0
    max_per_connection: int = 100
    idle_timeout_s: float = 30.0
    helo: str | None = None
    default_sender: str | None = None
    account: str | None = None

    def __repr__(self) -> str:  # the password is a Secret already; keep the repr short
        user = f"{self.username}@" if self.username else ""
        scheme = "smtps" if self.use_tls else "smtp"
        return f"SMTPConfig({scheme}://{user}{self.host}:{self.port}, pool={self.pool})"

    @classmethod
    def from_url(cls, url: str) -> SMTPConfig:
        parsed = ProviderURL.parse(url)
        if parsed.scheme not in ("smtp", "smtps"):
            raise ConfigurationError(f"not an SMTP URL: {parsed.redacted!r}")
        if not parsed.host:
            raise ConfigurationError(f"SMTP URL needs a host: {parsed.redacted!r}")
        use_tls = parsed.scheme == "smtps"
        starttls = parsed.flag("starttls", None)
        if use_tls and starttls:
            raise ConfigurationError("smtps:// is TLS from the start; starttls=1 is for smtp://")
        username = parsed.username or os.environ.get(USERNAME_ENV) or None
        port = parsed.port or (465 if use_tls else 587 if starttls else 25)
        starttls = _tls_for_credentials(parsed, starttls, None if use_tls else username)
        config = cls(
            host=parsed.host,
            port=port,
            use_tls=use_tls,
            starttls=False if use_tls else starttls,
            tls_verify=bool(parsed.flag("tls_verify", True)),
            ca_file=parsed.text("ca_file"),
            username=username,
            password=secret(parsed.password, PASSWORD_ENV) if username else None,
            pool=parsed.integer("pool", 4),
            timeout_s=parsed.number("timeout", 10.0, minimum=0.001),
            max_per_connection=parsed.integer("max_per_connection", 100),
            idle_timeout_s=parsed.number("idle_timeout", 30.0),
            helo=parsed.text("helo"),
            default_sender=parsed.text("from"),
            account=parsed.text("account"),
        )
        parsed.finish()
        return config


def _tls_for_credentials(parsed: ProviderURL, starttls: bool | None,
                         username: str | None) -> bool | None:
    """Credentials never travel in clear. With a username, STARTTLS is required (a server
    that does not offer it fails the connection before AUTH) unless the URL opts out of
    both on purpose: ``starttls=0&allow_plain_auth=1``."""
    allow_plain = bool(parsed.flag("allow_plain_auth", False))
    if not username or allow_plain:
        return starttls
    if starttls is False:
        raise ConfigurationError(
            f"{parsed.redacted!r} has credentials and starttls=0: they would travel in clear; "
            "use TLS (smtps://, or starttls=1, the default with credentials), or add "
            "allow_plain_auth=1 for a relay on a link you trust")
    return True


AUTH_CODES = frozenset({530, 534, 535, 538})
"""Replies about the login (RFC 4954: authentication required, a
stronger mechanism or encryption required, bad credentials): the account's trouble."""


class _Connection:
    """One pooled SMTP session and what the pool needs to know about it."""

    __slots__ = ("client", "last_used", "reused", "sent")

    def __init__(self, client: aiosmtplib.SMTP) -> None:
        self.client = client
        self.sent = 0
        self.last_used = time.monotonic()
        self.reused = False


class _Phase(Exception):
    """An SMTP failure tagged with the command it happened in (internal): ``mail``,
    ``rcpt`` or ``data``, the word the response text starts with. Whether the message can
    have left is the attempt's ``Phase``, not this."""

    def __init__(self, phase: str, error: BaseException) -> None:
        super().__init__(phase)
        self.phase = phase
        self.error = error


class SMTPProvider(Provider):
    """Sends over SMTP with a bounded pool of reused connections."""

    name = "smtp"
    capabilities = Capabilities()  # SMTP has no idempotency and no lookup
    needs_sender = True

    def configured_sender(self) -> str | None:
        return self.config.default_sender

    def endpoint(self) -> tuple[str, int] | None:
        return self.config.host, self.config.port

    def __init__(self, config: SMTPConfig) -> None:
        self.config = config
        self._slots = asyncio.Semaphore(config.pool)
        self._idle: list[_Connection] = []
        self._local_hostname = config.helo
        self._closed = False
        self.connections_opened = 0
        """How many connections this provider opened (reuse keeps it low)."""

    @classmethod
    def from_url(cls, url: str) -> SMTPProvider:
        return cls(SMTPConfig.from_url(url))

    def __repr__(self) -> str:
        return f"SMTPProvider({self.config!r})"

    @property
    def account(self) -> str:
        return self.config.account or f"smtp:{self.config.host}:{self.config.port}"

    async def open(self) -> None:
        self._closed = False
        self._slots = asyncio.Semaphore(self.config.pool)  # bound to the running loop
        if self._local_hostname is None:
            self._local_hostname = await asyncio.to_thread(socket.getfqdn)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _quit(conn.client)

    async def check(self) -> str | None:
        """No-send probe for ``postlane check``: connect, TLS and log in as a send would,
        then NOOP. None when the server accepted all of it, else what went wrong."""
        try:
            conn = await self._checkout()
        except SMTPAuthenticationError as exc:
            return f"login refused: {_describe(exc)}"
        except (SMTPException, OSError) as exc:
            return f"cannot connect: {_describe(exc)}"
        try:
            await conn.client.noop()
        except (SMTPException, OSError) as exc:
            _abort(conn.client)
            return f"the server did not answer NOOP: {_describe(exc)}"
        await _quit(conn.client)
        return None

    # -- sending ---------------------------------------------------------------------------
    async def send(self, delivery: Delivery) -> Outcome:
        try:
            sender = sender_of(delivery, self.config.default_sender)
            # A Unicode local part needs SMTPUTF8 (RFC 6531); only then is the message
            # RFC 6532 (UTF-8 headers). Anything else goes 7-bit, which every next hop
            # takes: a raw UTF-8 message relayed to a server without SMTPUTF8 would bounce.
            utf8 = has_unicode_local(delivery.recipient) or has_unicode_local(sender)
            data = build_email(delivery, sender, utf8=utf8).as_bytes()
        except InvalidMessage as exc:
            return refused_before_sending(exc)
        msg_id = message_id(delivery.key, sender)
        progress = current_progress()
        progress.reach(Phase.QUEUED)
        async with self._slots:
            # A pooled connection may have been closed by the server while idle: that shows
            # at MAIL, before anything was handed over, so one fresh connection is tried.
            for attempt in range(2):
                try:
                    conn = await self._checkout(progress)
                except SMTPAuthenticationError as exc:  # the account's login, not the message
                    return Outcome.account(f"auth: {_describe(exc)}")
                except (SMTPException, OSError) as exc:
                    if self._no_tls_for_credentials(exc):
                        return Outcome.account(
                            "connect: the server offers no STARTTLS, and credentials are "
                            "never sent in clear (starttls=0&allow_plain_auth=1 to allow it)")
                    return Outcome.transient(f"not sent: connect failed: {_describe(exc)}",
                                             phase=progress.phase)
                if utf8 and not conn.client.supports_extension("smtputf8"):
                    self._checkin(conn)  # the session is untouched: MAIL was never sent
                    return Outcome.permanent(
                        f"refused before sending: {NO_SMTPUTF8}").at(progress.phase)
                try:
                    reply = await self._transaction(conn, sender, delivery.recipient, data,
                                                    progress, utf8=utf8)
                except _Phase as failure:
                    await self._after_failure(conn, failure)
                    if (failure.phase == "mail" and conn.reused and attempt == 0
                            and isinstance(failure.error, SMTPServerDisconnected)):
                        continue
                    return _outcome_of_failure(failure, progress.phase or Phase.DATA)
                except BaseException:  # cancelled mid-transaction: the session is unusable
                    _abort(conn.client)
                    raise
                self._checkin(conn)
                return Outcome.accepted(msg_id, f"{reply.code} {reply.message}").at(
                    Phase.RESPONSE)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _transaction(self, conn: _Connection, sender: str, recipient: str,
                           data: bytes, progress: AttemptProgress, *, utf8: bool = False
                           ) -> aiosmtplib.SMTPResponse:
        """MAIL, RCPT, DATA. ``utf8``: the addresses go as UTF-8 with ``SMTPUTF8`` on MAIL
        (and ``BODY=8BITMIME``: an RFC 6532 message may have 8-bit bodies); domains are
        A-labels either way."""
        client = conn.client
        encoding = "utf-8" if utf8 else "ascii"
        options = ["SMTPUTF8"] if utf8 else []
        if utf8 and client.supports_extension("8bitmime"):  # RFC 6531 servers offer it
            options.append("BODY=8BITMIME")
        envelope_from = wire_address(sender, field="sender", utf8=utf8, transport=NO_UTF8)
        envelope_to = wire_address(recipient, field="to", utf8=utf8, transport=NO_UTF8)
        progress.reach(Phase.ENVELOPE)
        try:
            await client.mail(envelope_from, options=options, encoding=encoding)
        except (SMTPException, OSError) as exc:
            raise _Phase("mail", exc) from None
        try:
            await client.rcpt(envelope_to, encoding=encoding)
        except (SMTPException, OSError) as exc:
            raise _Phase("rcpt", exc) from None
        progress.reach(Phase.DATA)
        try:
            reply = await _data(client, data, progress)
        except (SMTPException, OSError) as exc:
            raise _Phase("data", exc) from None
        conn.sent += 1
        return reply

    def _no_tls_for_credentials(self, exc: BaseException) -> bool:
        """Did the connection stop, before AUTH, because STARTTLS (required with
        credentials) is not offered? The account's configuration, not the message's fault.
        (aiosmtplib says so with a bare ``SMTPException``, after closing the client.)"""
        return (self.config.username is not None and self.config.starttls is True
                and type(exc) is SMTPException and "STARTTLS" in str(exc))

    # -- the pool --------------------------------------------------------------------------
    async def _checkout(self, progress: AttemptProgress | None = None) -> _Connection:
        """A connection ready for MAIL: an idle pooled one, else a new one set up step by
        step (connect, EHLO, STARTTLS, AUTH), each step reported to ``progress``."""
        progress = progress or AttemptProgress()
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.client.is_connected and now - conn.last_used < self.config.idle_timeout_s:
                conn.reused = True
                return conn
            await _quit(conn.client)
        # STARTTLS and AUTH are driven here, not by connect(), so each reports its phase.
        client = aiosmtplib.SMTP(
            hostname=self.config.host,
            port=self.config.port,
            local_hostname=self._local_hostname or "localhost",
            timeout=self.config.timeout_s,
            use_tls=self.config.use_tls,
            start_tls=False,
            validate_certs=self.config.tls_verify,
            cert_bundle=self.config.ca_file,
        )
        try:
            progress.reach(Phase.CONNECT)
            await client.connect()
            progress.reach(Phase.HELLO)
            await _hello(client)
            starttls = self.config.starttls
            if starttls is None:  # if offered (never on smtps://, TLS from the start)
                starttls = not self.config.use_tls and client.supports_extension("starttls")
            if starttls:
                progress.reach(Phase.TLS)
                await client.starttls()
            if self.config.username:
                progress.reach(Phase.AUTH)
                password = self.config.password.reveal() if self.config.password else ""
                await client.login(self.config.username, password)
        except BaseException:
            _abort(client)
            raise
        self.connections_opened += 1
        return _Connection(client)

    def _checkin(self, conn: _Connection) -> None:
        conn.last_used = time.monotonic()
        if (self._closed or not conn.client.is_connected
                or conn.sent >= self.config.max_per_connection):
            _schedule_quit(conn.client)
            return
        self._idle.append(conn)

    async def _after_failure(self, conn: _Connection, failure: _Phase) -> None:
        """After a refused MAIL or RCPT the session is good again once reset; after a drop,
        a timeout, a 421 or anything in DATA it is not, and it is closed."""
        error = failure.error
        answered = isinstance(error, SMTPResponseException) and error.code != 421
        if answered and failure.phase in ("mail", "rcpt") and conn.client.is_connected:
            try:
                await conn.client.rset()
            except (SMTPException, OSError):
                _abort(conn.client)
                return
            except BaseException:
                _abort(conn.client)
                raise
            self._checkin(conn)
        else:
            _abort(conn.client)


async def _hello(client: aiosmtplib.SMTP) -> None:
    try:
        await client.ehlo()
    except SMTPHeloError:
        await client.helo()


async def _data(client: aiosmtplib.SMTP, message: bytes,
                progress: AttemptProgress) -> aiosmtplib.SMTPResponse:
    """DATA in two halves (aiosmtplib's ``data()`` is one call): the command and its 354,
    then the message with its final dot, the point of no return, reported just before
    the write. No await between the report and the write, so a deadline falls either
    before both or after both."""
    start = await client.execute_command(b"DATA")
    if start.code != SMTPStatus.start_input:
        raise SMTPDataError(start.code, start.message)
    protocol = client.protocol
    if protocol is None or protocol.transport is None or protocol.transport.is_closing():
        raise SMTPServerDisconnected("Connection lost")
    payload = PERIOD_REGEX.sub(b"..", normalize_message_line_endings(message)) + b".\r\n"
    progress.reach(Phase.RESPONSE)  # raises if the worker gave up: the dot never leaves
    protocol.write(payload)
    reply = await protocol.read_response(timeout=client.timeout)
    if reply.code != SMTPStatus.completed:
        raise SMTPDataError(reply.code, reply.message)
    return reply


def _outcome_of_failure(failure: _Phase, reached: Phase) -> Outcome:
    """A failed MAIL, RCPT or DATA: a refusal by its code, anything else (a drop, a
    timeout) by whether the final dot had been written (``reached``)."""
    error = failure.error
    command = failure.phase
    if isinstance(error, SMTPResponseException) and not isinstance(error, SMTPTimeoutError):
        outcome = outcome_of_reply(error.code, error.message, command)
        if outcome.kind is OutcomeClass.AMBIGUOUS and not reached.may_have_reached_provider:
            outcome = Outcome.transient(outcome.response)  # an odd answer to DATA itself
        return outcome.at(reached)
    text = f"{command}: {_describe(error)}"
    if reached.may_have_reached_provider:
        return Outcome.ambiguous(f"connection lost or timed out after the final dot ({text})",
                                 phase=reached)
    return Outcome.transient(f"not sent: {text}", phase=reached)


def outcome_of_reply(code: int, message: str, phase: str) -> Outcome:
    """The SMTP reply table: a refusal's class depends on its first digit."""
    response = f"{phase}: {code} {message}".strip()
    if code in AUTH_CODES:
        return Outcome.account(response)
    if 400 <= code < 500:
        return Outcome.transient(response)
    if 500 <= code < 600:
        return Outcome.permanent(response)
    # An answer outside 4xx/5xx where a 2xx/3xx was expected: the server is confused.
    if phase == "data":
        return Outcome.ambiguous(response)
    return Outcome.transient(response)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SMTPAuthenticationError):
        return f"authentication failed ({exc.code})"
    if isinstance(exc, (SMTPRecipientRefused, SMTPSenderRefused, SMTPDataError)):
        return f"{exc.code} {exc.message}"
    if isinstance(exc, SMTPTimeoutError):
        return "timed out"
    if isinstance(exc, SMTPServerDisconnected):
        return "connection lost"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    return f"{type(exc).__name__}: {exc}"


def _abort(client: aiosmtplib.SMTP) -> None:
    # Closing a broken transport must not turn into a handler error.
    with contextlib.suppress(Exception):
        client.close()


async def _quit(client: aiosmtplib.SMTP) -> None:
    if not client.is_connected:
        _abort(client)
        return
    try:
        async with asyncio.timeout(1.0):
            await client.quit()
    except (SMTPException, OSError, TimeoutError):
        pass
    finally:
        _abort(client)


_background: set[asyncio.Task[None]] = set()


def _schedule_quit(client: aiosmtplib.SMTP) -> None:
    task = asyncio.ensure_future(_quit(client))
    _background.add(task)
    task.add_done_callback(_background.discard)
