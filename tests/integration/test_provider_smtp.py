"""The SMTP adapter against real servers on loopback.

``aiosmtpd`` runs inside the test's own event loop (so a handler can drop a connection,
refuse a recipient, or sit on the final dot), and Postfix's ``smtp-sink`` takes 1,000
messages from the real ``Worker`` in the end-to-end test.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from email import message_from_bytes
from email.policy import default
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP as SMTPServer
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session
from conftest import msg

from postlane.core.message import Delivery
from postlane.core.outcomes import OutcomeClass
from postlane.providers.mime import message_id
from postlane.providers.smtp import SMTPProvider
from postlane.store import Store
from postlane.worker import Worker, WorkerConfig
from tests.factories import delivery as make_delivery

SECRET = "sm7p-Pa55word"


def delivery(key: str = "reset:42", **changes: Any) -> Delivery:
    """The shared factory, with this module's sender and id."""
    return make_delivery(key, **{"id": 1, "sender": "alice@example.org", **changes})


# -- an aiosmtpd server in this event loop --------------------------------------------------
class Handler:
    """Records what arrived; ``on_rcpt``/``on_data`` override the answers."""

    def __init__(self) -> None:
        self.received: list[Envelope] = []
        self.on_rcpt: Callable[[str], Awaitable[str | None]] | None = None
        self.on_data: Callable[[SMTPServer, Envelope], Awaitable[str | None]] | None = None

    async def handle_RCPT(self, server: SMTPServer, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        if self.on_rcpt is not None:
            answer = await self.on_rcpt(address)
            if answer is not None:
                return answer
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTPServer, session: Session,
                          envelope: Envelope) -> str:
        if self.on_data is not None:
            answer = await self.on_data(server, envelope)
            if answer is not None:
                return answer
        self.received.append(envelope)
        return "250 2.0.0 Ok: queued"


class Server:
    def __init__(self, handler: Handler, port: int, sessions: list[SMTPServer]) -> None:
        self.handler = handler
        self.port = port
        self.sessions = sessions

    def drop_idle_connections(self) -> None:
        for session in self.sessions:
            if session.transport is not None:
                session.transport.close()


@asynccontextmanager
async def smtp_server(handler: Handler, **options: Any) -> AsyncIterator[Server]:
    tls = options.pop("implicit_tls", None)
    sessions: list[SMTPServer] = []

    def factory() -> SMTPServer:
        session = SMTPServer(handler, hostname="test.local", **options)
        sessions.append(session)
        return session

    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0, ssl=tls)
    try:
        yield Server(handler, server.sockets[0].getsockname()[1], sessions)
    finally:
        server.close()
        for session in sessions:
            if session.transport is not None:
                session.transport.abort()
        await server.wait_closed()


@asynccontextmanager
async def provider(url: str) -> AsyncIterator[SMTPProvider]:
    smtp = SMTPProvider.from_url(url)
    await smtp.open()
    try:
        yield smtp
    finally:
        await smtp.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the mapping, against a real server ----------------------------------------------------
async def test_accepted_message_arrives_with_key_and_stable_message_id() -> None:
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?helo=client.test") as smtp:
        first = await smtp.send(delivery())
        again = await smtp.send(delivery(attempts=1, claims=2))
    assert first.kind is OutcomeClass.ACCEPTED and again.kind is OutcomeClass.ACCEPTED
    expected = message_id("reset:42", "alice@example.org")
    assert first.provider_message_id == again.provider_message_id == expected
    assert "250" in (first.response or "")
    ids = []
    for envelope in handler.received:
        parsed = message_from_bytes(envelope.original_content or b"", policy=default)
        ids.append(parsed["Message-ID"])
        assert parsed["X-Postlane-Key"] == "reset:42"
        assert envelope.mail_from == "alice@example.org"
        assert envelope.rcpt_tos == ["bob@example.com"]
    assert ids == [expected, expected]


async def test_dot_stuffing_is_byte_identical() -> None:
    text = ".leading dot\n..two dots\n.\nmiddle . line\n. space after dot\nlast\n"
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}") as smtp:
        outcome = await smtp.send(delivery(text=text))
    assert outcome.kind is OutcomeClass.ACCEPTED
    (envelope,) = handler.received
    raw = envelope.original_content or b""
    body = raw.split(b"\r\n\r\n", 1)[1]
    assert body == text.replace("\n", "\r\n").encode()
    parsed = message_from_bytes(raw, policy=default)
    assert parsed.get_content().replace("\r\n", "\n") == text


async def test_rejected_recipient_is_permanent_and_the_connection_is_kept() -> None:
    handler = Handler()

    async def reject(address: str) -> str | None:
        return "550 5.1.1 <bob@example.com>: user unknown" if address.startswith("bob") else None

    handler.on_rcpt = reject
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?pool=1") as smtp:
        outcome = await smtp.send(delivery())
        follow_up = await smtp.send(delivery("reset:43", recipient="carol@example.com"))
        opened = smtp.connections_opened
    assert outcome.kind is OutcomeClass.PERMANENT
    assert "550" in (outcome.response or "") and "rcpt" in (outcome.response or "")
    assert follow_up.kind is OutcomeClass.ACCEPTED
    assert opened == 1  # reset (RSET) and reused, not reconnected


@pytest.mark.parametrize("where", ["rcpt", "data"])
async def test_451_is_transient(where: str) -> None:
    handler = Handler()

    async def later(*_: Any) -> str:
        return "451 4.3.0 try again later"

    if where == "rcpt":
        handler.on_rcpt = later
    else:
        handler.on_data = later
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}") as smtp:
        outcome = await smtp.send(delivery())
    assert outcome.kind is OutcomeClass.TRANSIENT
    assert "451" in (outcome.response or "")
    assert handler.received == []


async def test_dropped_after_the_final_dot_is_ambiguous() -> None:
    handler = Handler()
    got_it = asyncio.Event()

    async def drop(server: SMTPServer, envelope: Envelope) -> str:
        got_it.set()  # the server has the whole message...
        assert server.transport is not None
        server.transport.abort()  # ...and hangs up without a reply
        await asyncio.Event().wait()
        return "250 never sent"

    handler.on_data = drop
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?timeout=5") as smtp:
        outcome = await smtp.send(delivery())
    assert got_it.is_set()
    assert outcome.kind is OutcomeClass.AMBIGUOUS


async def test_no_reply_to_the_final_dot_is_ambiguous() -> None:
    handler = Handler()
    release = asyncio.Event()

    async def sit(server: SMTPServer, envelope: Envelope) -> str:
        await release.wait()
        return "250 too late"

    handler.on_data = sit
    try:
        async with smtp_server(handler) as server, \
                provider(f"smtp://127.0.0.1:{server.port}?timeout=0.3") as smtp:
            outcome = await smtp.send(delivery())
    finally:
        release.set()
    assert outcome.kind is OutcomeClass.AMBIGUOUS


async def test_refused_port_is_transient() -> None:
    async with provider(f"smtp://127.0.0.1:{free_port()}?timeout=2") as smtp:
        outcome = await smtp.send(delivery())
    assert outcome.kind is OutcomeClass.TRANSIENT
    assert "connect failed" in (outcome.response or "")


async def test_421_at_connect_is_transient() -> None:
    async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"421 4.3.2 too busy, come back later\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(busy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with provider(f"smtp://127.0.0.1:{port}?timeout=2") as smtp:
            outcome = await smtp.send(delivery())
    finally:
        server.close()
        await server.wait_closed()
    assert outcome.kind is OutcomeClass.TRANSIENT


async def test_connections_are_reused_within_the_pool_bound() -> None:
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?pool=3") as smtp:
        outcomes = await asyncio.gather(*(smtp.send(delivery(f"k:{i}")) for i in range(40)))
        opened = smtp.connections_opened
    assert {o.kind for o in outcomes} == {OutcomeClass.ACCEPTED}
    assert len(handler.received) == 40
    assert opened <= 3 < 40
    assert len(server.sessions) == opened


async def test_a_connection_closed_while_idle_is_replaced_transparently() -> None:
    handler = Handler()
    async with smtp_server(handler) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?pool=1") as smtp:
        assert (await smtp.send(delivery("k:1"))).kind is OutcomeClass.ACCEPTED
        server.drop_idle_connections()
        await asyncio.sleep(0)  # let the close reach the client's transport
        outcome = await smtp.send(delivery("k:2"))
        opened = smtp.connections_opened
    assert outcome.kind is OutcomeClass.ACCEPTED
    assert opened == 2
    assert len(handler.received) == 2


# -- TLS and AUTH ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_context() -> Iterator[ssl.SSLContext]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
        yield context


class Authenticator:
    def __init__(self) -> None:
        self.logins: list[tuple[str, str]] = []

    def __call__(self, server: SMTPServer, session: Session, envelope: Envelope,
                 mechanism: str, auth_data: Any) -> AuthResult:
        assert isinstance(auth_data, LoginPassword)
        login = (auth_data.login.decode(), auth_data.password.decode())
        self.logins.append(login)
        return AuthResult(success=login == ("mailer", SECRET), handled=False)


async def test_starttls_and_auth(tls_context: ssl.SSLContext,
                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    handler, auth = Handler(), Authenticator()
    async with smtp_server(handler, tls_context=tls_context, require_starttls=True,
                           authenticator=auth, auth_require_tls=True) as server:
        url = f"smtp://mailer:{SECRET}@127.0.0.1:{server.port}?starttls=1&tls_verify=0"
        async with provider(url) as smtp:
            outcome = await smtp.send(delivery())
        bad = f"smtp://mailer:wrong-{SECRET}@127.0.0.1:{server.port}?starttls=1&tls_verify=0"
        async with provider(bad) as smtp:
            refused = await smtp.send(delivery())
    assert outcome.kind is OutcomeClass.ACCEPTED
    assert auth.logins[0] == ("mailer", SECRET)
    assert len(handler.received) == 1
    assert refused.kind is OutcomeClass.ACCOUNT  # the login, not the message
    assert "authentication failed" in (refused.response or "")
    assert SECRET not in (refused.response or "")
    client_logs = [r.getMessage() for r in caplog.records if not r.name.startswith("mail.")]
    assert all(SECRET not in line for line in client_logs)


async def test_starttls_required_but_not_offered_is_transient() -> None:
    async with smtp_server(Handler()) as server, \
            provider(f"smtp://127.0.0.1:{server.port}?starttls=1&tls_verify=0") as smtp:
        outcome = await smtp.send(delivery())
    assert outcome.kind is OutcomeClass.TRANSIENT


@pytest.fixture
def auth_commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every AUTH command an in-process server received (before it answers it)."""
    seen: list[str] = []
    original = SMTPServer.smtp_AUTH

    async def recording(self: SMTPServer, arg: str) -> None:
        seen.append(arg.split(" ")[0] if arg else "")
        await original(self, arg)

    monkeypatch.setattr(SMTPServer, "smtp_AUTH", recording)
    return seen


async def test_credentials_never_go_to_a_server_without_starttls(
    auth_commands: list[str],
) -> None:
    """The server takes AUTH in clear (it would accept the password) but offers no
    STARTTLS: with credentials and no opt-out the connection fails before AUTH."""
    handler, auth = Handler(), Authenticator()
    async with smtp_server(handler, authenticator=auth, auth_require_tls=False) as server:
        async with provider(f"smtp://mailer:{SECRET}@127.0.0.1:{server.port}") as smtp:
            outcome = await smtp.send(delivery())
            probe = await smtp.check()
        assert auth_commands == [] and auth.logins == [] and handler.received == []
        # The account's configuration, not the message's fault: the breaker pauses
        # sending, nothing is spent, never a dead letter.
        assert outcome.kind is OutcomeClass.ACCOUNT
        assert "STARTTLS" in (outcome.response or "") and SECRET not in (outcome.response or "")
        assert probe is not None and "STARTTLS" in probe
        # The explicit opt-out, for a relay on a trusted link: AUTH in clear, then the send.
        opted_out = (f"smtp://mailer:{SECRET}@127.0.0.1:{server.port}"
                     "?starttls=0&allow_plain_auth=1")
        async with provider(opted_out) as smtp:
            sent = await smtp.send(delivery())
    assert sent.kind is OutcomeClass.ACCEPTED
    assert auth_commands and auth.logins == [("mailer", SECRET)]


async def test_implicit_tls_with_credentials_from_the_environment(
    tls_context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POSTLANE_SMTP_USERNAME", "mailer")
    monkeypatch.setenv("POSTLANE_SMTP_PASSWORD", SECRET)
    handler, auth = Handler(), Authenticator()
    async with smtp_server(handler, implicit_tls=tls_context, authenticator=auth,
                           auth_require_tls=False) as server, \
            provider(f"smtps://127.0.0.1:{server.port}?tls_verify=0") as smtp:
        outcome = await smtp.send(delivery())
    assert outcome.kind is OutcomeClass.ACCEPTED
    assert auth.logins == [("mailer", SECRET)]


async def test_header_injection_is_refused_before_connecting() -> None:
    async with provider(f"smtp://127.0.0.1:{free_port()}") as smtp:
        outcome = await smtp.send(delivery(headers={"X-A": "1\r\nBcc: victim@example.com"}))
        assert smtp.connections_opened == 0
    assert outcome.kind is OutcomeClass.PERMANENT


# -- end to end: the Worker, 1,000 messages, Postfix's smtp-sink ----------------------------
def smtp_sink_binary() -> str:
    found = shutil.which("smtp-sink") or ("/usr/sbin/smtp-sink"
                                          if os.path.exists("/usr/sbin/smtp-sink") else None)
    if found is None:
        pytest.fail("smtp-sink is required (Debian package 'postfix'; `.ci/run` installs it: "
                    "apt-get install -y postfix)", pytrace=False)
    return found


@pytest.fixture
def smtp_sink(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    binary = smtp_sink_binary()
    port = free_port()
    dump = tmp_path / "sink"
    dump.mkdir()
    log = (tmp_path / "smtp-sink.log").open("wb")
    process = subprocess.Popen(
        [binary, "-u", "root", "-d", f"{dump}/%H%M%S.", f"127.0.0.1:{port}", "256"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"smtp-sink did not start: {(tmp_path / 'smtp-sink.log')}")
                time.sleep(0.02)
        yield port, dump
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def keys_in_sink(dump: Path) -> Counter[str]:
    keys: Counter[str] = Counter()
    for path in dump.iterdir():
        for line in path.read_bytes().split(b"\n"):
            if line.startswith(b"X-Postlane-Key: "):
                keys[line.split(b": ", 1)[1].strip().decode()] += 1
    return keys


async def test_worker_delivers_1000_messages_exactly_once_through_smtp_sink(
    store: Store, smtp_sink: tuple[int, Path],
) -> None:
    port, dump = smtp_sink
    count = 1000
    keys = [f"e2e:{i}" for i in range(count)]
    await store.enqueue_many([msg(key, lane="bulk", sender="app@example.org",
                                  to=f"user{i}@example.com") for i, key in enumerate(keys)])
    smtp = SMTPProvider.from_url(f"smtp://127.0.0.1:{port}?pool=8&helo=worker.test")
    worker = Worker(store, smtp, config=WorkerConfig(
        concurrency=64, drain=True, attempt_timeout_s=10, controls_interval_s=0.05,
        poll_interval_s=0.1,
    ))
    async with asyncio.timeout(120):
        await worker.run()
    stats = await store.stats()
    assert stats.states.get("sent", 0) == count, stats.states
    deadline = time.monotonic() + 30  # smtp-sink writes each file as the transaction ends
    while len(list(dump.iterdir())) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    seen = keys_in_sink(dump)
    assert set(seen) == set(keys)
    assert max(seen.values()) == 1
    assert smtp.connections_opened <= 8 * 2  # reused: far fewer connections than messages
