"""No-send probes behind `postlane check`: a real SMTP server on loopback accepts or refuses
the login; nothing is sent either way."""

from __future__ import annotations

import socket
import ssl

import pytest

from postlane.check import check_provider
from postlane.providers.registry import open_provider
from tests.integration.test_provider_smtp import (  # noqa: F401  (the tls_context fixture)
    SECRET,
    Authenticator,
    Handler,
    smtp_server,
    tls_context,
)

pytestmark = pytest.mark.asyncio


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_smtp_probe_logs_in_and_sends_nothing(tls_context: ssl.SSLContext) -> None:
    handler, auth = Handler(), Authenticator()
    async with smtp_server(handler, tls_context=tls_context, require_starttls=True,
                           authenticator=auth, auth_require_tls=True) as server:
        options = "starttls=1&tls_verify=0&from=ops@example.org"
        good = f"smtp://mailer:{SECRET}@127.0.0.1:{server.port}?{options}"
        bad = f"smtp://mailer:wrong@127.0.0.1:{server.port}?{options}"
        [ok] = await check_provider(open_provider(good))
        [refused] = await check_provider(open_provider(bad))
    assert ok.status == "ok" and "accepted the credentials" in ok.message
    assert refused.status == "fail" and "login refused" in refused.message
    assert SECRET not in refused.message and "wrong" not in refused.message
    assert handler.received == []  # a probe sends nothing


async def test_unreachable_providers_fail_the_check() -> None:
    for url in (f"smtp://127.0.0.1:{closed_port()}?from=ops@example.org",
                f"sandbox+http://127.0.0.1:{closed_port()}"):
        [finding] = await check_provider(open_provider(url), timeout_s=5)
        assert finding.status == "fail", url
