"""Provider URLs, secrets, and the MIME form every attempt of a key shares. No I/O."""

from __future__ import annotations

from datetime import UTC, datetime
from email import message_from_bytes
from email.policy import default
from typing import Any

import pytest

from postlane.core.message import Delivery
from postlane.core.states import State
from postlane.errors import ConfigurationError, InvalidHeader, InvalidMessage
from postlane.providers.http import JsonHttpProvider
from postlane.providers.mime import build_email, key_digest, message_id
from postlane.providers.options import ProviderURL, Secret
from postlane.providers.postmark import PostmarkProvider
from postlane.providers.registry import open_provider
from postlane.providers.resend import ResendProvider
from postlane.providers.sandbox_client import SandboxHttpProvider
from postlane.providers.ses import SESProvider
from postlane.providers.smtp import SMTPConfig, SMTPProvider

SECRET = "s3cr3t-Pa55"


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


# -- the registry --------------------------------------------------------------------------
@pytest.mark.parametrize(("url", "cls", "account"), [
    ("smtp://127.0.0.1:2525", SMTPProvider, "smtp:127.0.0.1:2525"),
    ("smtps://mail.example.com", SMTPProvider, "smtp:mail.example.com:465"),
    ("ses://eu-west-1?configuration_set=events", SESProvider, "ses:eu-west-1"),
    ("https://api.example.com/v1/send", JsonHttpProvider, "http:api.example.com"),
    ("postmark://?message_stream=outbound", PostmarkProvider, "postmark"),
    ("resend://", ResendProvider, "resend"),
    ("sandbox+http://127.0.0.1:8025", SandboxHttpProvider, "sandbox:127.0.0.1:8025"),
    ("smtp://127.0.0.1:2525?account=primary", SMTPProvider, "primary"),
])
def test_open_provider_by_scheme(url: str, cls: type, account: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTLANE_POSTMARK_TOKEN", "pm")
    monkeypatch.setenv("POSTLANE_RESEND_TOKEN", "re")
    provider = open_provider(url)
    assert isinstance(provider, cls)
    assert provider.account == account


@pytest.mark.parametrize("url", [
    f"smtp://user:{SECRET}@host?bogus=1",
    f"smtp://user:{SECRET}@host?pool=many",
    f"smtp://user:{SECRET}@host?pool=0",
    f"smtp://user:{SECRET}@host?starttls=maybe",
    f"smtps://user:{SECRET}@host?starttls=1",
    f"ses://id:{SECRET}@eu-west-1?timeout=-1",
    f"https://user:{SECRET}@api.example.com/send?unknown=1",
    f"postmark://:{SECRET}@?nope=1",
    f"nosuch://user:{SECRET}@host",
])
def test_bad_urls_are_refused_without_showing_the_secret(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_provider(url)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(("url", "env"), [
    ("postmark://", "POSTLANE_POSTMARK_TOKEN"),
    ("resend://", "POSTLANE_RESEND_TOKEN"),
])
def test_api_adapters_need_a_token(url: str, env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env, raising=False)
    with pytest.raises(ConfigurationError, match=env):
        open_provider(url)


def test_ses_region_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    assert open_provider("ses://").account == "ses:eu-central-1"
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(ConfigurationError, match="region"):
        open_provider("ses://")


# -- SMTP configuration -------------------------------------------------------------------
@pytest.mark.parametrize(("url", "port", "tls", "starttls"), [
    ("smtp://h", 25, False, None),
    ("smtp://h?starttls=1", 587, False, True),
    ("smtp://h:2525?starttls=0", 2525, False, False),
    ("smtps://h", 465, True, False),
])
def test_smtp_ports_and_tls(url: str, port: int, tls: bool, starttls: bool | None) -> None:
    config = SMTPConfig.from_url(url)
    assert (config.port, config.use_tls, config.starttls) == (port, tls, starttls)


@pytest.mark.parametrize(("url", "starttls"), [
    (f"smtp://mailer:{SECRET}@h", True),  # credentials: TLS required by default
    (f"smtp://mailer:{SECRET}@h?starttls=1", True),
    (f"smtp://mailer:{SECRET}@h?starttls=0&allow_plain_auth=1", False),  # opted out
    (f"smtp://mailer:{SECRET}@h?allow_plain_auth=1", None),  # TLS if offered, else clear
    (f"smtps://mailer:{SECRET}@h", False),  # TLS from the start
    ("smtp://h", None),  # no credentials: nothing to protect
])
def test_smtp_credentials_require_tls_unless_opted_out(url: str, starttls: bool | None) -> None:
    assert SMTPConfig.from_url(url).starttls is starttls


def test_smtp_credentials_without_tls_need_the_explicit_opt_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="allow_plain_auth=1") as caught:
        SMTPConfig.from_url(f"smtp://mailer:{SECRET}@h:25?starttls=0")
    assert SECRET not in str(caught.value)
    monkeypatch.setenv("POSTLANE_SMTP_USERNAME", "env-user")
    with pytest.raises(ConfigurationError, match="in clear"):
        SMTPConfig.from_url("smtp://h?starttls=0")


def test_smtp_credentials_from_url_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SMTPConfig.from_url(f"smtp://mailer:{SECRET}@h:587?starttls=1&pool=8&timeout=2.5")
    assert config.username == "mailer" and config.password == Secret(SECRET)
    assert (config.pool, config.timeout_s) == (8, 2.5)
    monkeypatch.setenv("POSTLANE_SMTP_USERNAME", "env-user")
    monkeypatch.setenv("POSTLANE_SMTP_PASSWORD", SECRET)
    config = SMTPConfig.from_url("smtp://h")
    assert config.username == "env-user" and config.password is not None
    assert config.password.reveal() == SECRET


@pytest.mark.parametrize("url", [
    f"smtp://mailer:{SECRET}@h:587",
    f"ses://AKIDEXAMPLE:{SECRET}@eu-west-1",
    f"postmark://:{SECRET}@",
    f"resend://:{SECRET}@",
    f"https://:{SECRET}@api.example.com/send",
])
def test_secrets_stay_out_of_reprs(url: str) -> None:
    provider = open_provider(url)
    shown = repr(provider) + str(provider) + repr(vars(provider))
    assert SECRET not in shown
    assert "***" in repr(Secret(SECRET)) and SECRET not in str(Secret(SECRET))


def test_provider_url_redacts_the_password() -> None:
    parsed = ProviderURL.parse(f"smtp://u:{SECRET}@h:25?pool=2")
    assert SECRET not in parsed.redacted and parsed.password == SECRET


# -- the MIME form ------------------------------------------------------------------------
def test_message_id_is_derived_from_the_key() -> None:
    assert message_id("reset:42", "alice@example.org") == \
        f"<{key_digest('reset:42')[:32]}@example.org>"
    assert message_id("reset:42") == f"<{key_digest('reset:42')[:32]}@postlane>"
    assert message_id("reset:42", "a@x.org") != message_id("reset:43", "a@x.org")


def test_every_attempt_of_a_key_is_the_same_message() -> None:
    first = build_email(delivery(), "alice@example.org").as_bytes()
    again = build_email(delivery(attempts=3, claims=4), "alice@example.org").as_bytes()
    assert first == again
    parsed = message_from_bytes(first, policy=default)
    assert parsed["Message-ID"] == message_id("reset:42", "alice@example.org")
    assert parsed["X-Postlane-Key"] == "reset:42"
    assert parsed["Date"] == "Thu, 02 Jan 2025 03:04:05 +0000"
    assert b"\r\n" in first and b"\n" not in first.replace(b"\r\n", b"")


def test_caller_headers_add_to_postlanes_but_never_replace_the_id_or_the_key() -> None:
    built = build_email(delivery(headers={"Date": "Fri, 03 Jan 2025 00:00:00 +0000",
                                          "X-Campaign": "spring-2025"}),
                        "alice@example.org")
    assert built.get_all("Date") == ["Fri, 03 Jan 2025 00:00:00 +0000"]
    assert built["X-Campaign"] == "spring-2025"
    for name in ("X-Postlane-Key", "Message-ID", "Bcc", "From", "List-Unsubscribe"):
        with pytest.raises(InvalidHeader):
            build_email(delivery(headers={name: "<other@example.org>"}), "alice@example.org")


@pytest.mark.parametrize("changes", [
    {"headers": {"X-Evil": "a\r\nBcc: victim@example.com"}},
    {"headers": {"Bad Name": "x"}},
    {"headers": {"Content-Transfer-Encoding": "base64"}},
    {"subject": "hello\r\nBcc: victim@example.com"},
    {"recipient": "bob@example.com\nBcc: victim@example.com"},
    {"sender": "alice@example.org\r\nX: y"},
    {"text": None, "html": None},
])
def test_injection_and_empty_bodies_are_refused(changes: dict[str, Any]) -> None:
    item = delivery(**changes)
    with pytest.raises(InvalidMessage):
        build_email(item, item.sender or "alice@example.org")


def test_html_and_text_become_alternatives() -> None:
    built = build_email(delivery(html="<p>Follow the link.</p>"), "alice@example.org")
    assert built.get_content_type() == "multipart/alternative"
    html_only = build_email(delivery(text=None, html="<p>x</p>"), "alice@example.org")
    assert html_only.get_content_type() == "text/html"
