"""Providers are chosen by URL: ``noop://``, ``record:///path.db?dedupe=1``, ``sandbox://``,
``sandbox+http://host:port``, ``smtp://`` / ``smtps://``, ``ses://region``, ``http(s)://``
(a generic JSON API), ``postmark://`` and ``resend://``; for SMS, ``sandbox-sms://`` and
``twilio://``. See docs/providers.md and docs/sms.md."""

from __future__ import annotations

import importlib
from urllib.parse import parse_qs, urlsplit

from postlane.core.redaction import redact_url
from postlane.errors import ConfigurationError
from postlane.providers.base import Provider


def open_provider(url: str) -> Provider:
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "noop":
        from postlane.providers.testing import NoopProvider

        return NoopProvider()
    if parts.scheme == "sandbox":
        from postlane.providers.sandbox import SandboxConfig, SandboxProvider

        return SandboxProvider(SandboxConfig.from_query(parts.query))
    if parts.scheme == "record":
        from postlane.providers.testing import RecordFileProvider

        if not parts.path:
            raise ConfigurationError("record:// needs a file path: record:///tmp/sends.db")
        return RecordFileProvider(
            parts.path,
            deduplicate=query.get("dedupe", "1") not in ("0", "false", "no"),
            latency_s=float(query.get("latency_ms", "0")) / 1000,
            hang_key=query.get("hang_key"),
        )
    adapter = _ADAPTERS.get(parts.scheme)
    if adapter is not None:
        module, cls = adapter
        provider_class = getattr(importlib.import_module(f"postlane.providers.{module}"), cls)
        return provider_class.from_url(url)  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"unknown provider URL {redact_url(url)!r} (supported: noop://, record:///path.db, "
        f"sandbox://, {', '.join(f'{scheme}://' for scheme in _ADAPTERS)})"
    )


_ADAPTERS: dict[str, tuple[str, str]] = {
    "sandbox+http": ("sandbox_client", "SandboxHttpProvider"),
    "sandbox+https": ("sandbox_client", "SandboxHttpProvider"),
    "smtp": ("smtp", "SMTPProvider"),
    "smtps": ("smtp", "SMTPProvider"),
    "ses": ("ses", "SESProvider"),
    "http": ("http", "JsonHttpProvider"),
    "https": ("http", "JsonHttpProvider"),
    "postmark": ("postmark", "PostmarkProvider"),
    "resend": ("resend", "ResendProvider"),
    "sandbox-sms": ("sms", "SandboxSmsProvider"),
    "twilio": ("twilio", "TwilioProvider"),
}
"""scheme -> (module under postlane.providers, class with ``from_url``); imported on use."""
