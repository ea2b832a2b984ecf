"""Providers are chosen by URL: ``noop://``, ``record:///path.db?dedupe=1`` and, as the
adapters land, ``sandbox://``, ``smtp://``, ``ses://`` and ``http(s)://``."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from postlane.errors import ConfigurationError
from postlane.providers.base import Provider
from postlane.store import redact_url


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
    raise ConfigurationError(
        f"unknown provider URL {redact_url(url)!r} (supported: noop://, sandbox://, record:///path.db)"
    )
