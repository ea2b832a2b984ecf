"""Redaction: how secrets and recipient addresses look when they are logged or printed.

One place for both, since the rule "never unredacted in logs" is one rule: the store, the
providers, the CLI and the worker all show URLs and addresses through these.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def redact_address(address: str) -> str:
    """``alice@example.com`` -> ``a***@example.com``: enough to correlate, not to leak."""
    local, sep, domain = address.rpartition("@")
    if not sep:
        return "***" if len(address) < 4 else address[:2] + "***"
    return f"{local[:1]}***@{domain}"


def redact_url(url: str) -> str:
    """Hide the password of a URL (database, provider, limiter) so it can be printed or
    logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
