"""API keys: random tokens with scopes, stored as their SHA-256, shown once at creation.

A token is ``pl_`` followed by 43 URL-safe characters (32 random bytes). The store keeps
its SHA-256 and its first characters (the *prefix*, to tell keys apart in a list); the
token itself cannot be recovered, only revoked and replaced.

Scopes:

- ``send``: ``POST /v1/messages``;
- ``read``: every ``GET`` (messages, dead letters, status, imports, templates) and the
  dashboard;
- ``operate``: what changes the pipeline's course: replay and discard dead letters, pause
  and resume lanes and imports, manage templates.

Scopes do not imply one another: an operator key for the dashboard is ``read,operate``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

from postlane.core.records import ApiKey
from postlane.errors import ConfigurationError
from postlane.store.roles import ApiKeyStore

SCOPES = ("send", "read", "operate")
TOKEN_PREFIX = "pl_"
PREFIX_CHARS = len(TOKEN_PREFIX) + 8

__all__ = ["SCOPES", "ApiKey", "authenticate", "create_key", "hash_token", "parse_scopes"]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_scopes(scopes: str | Iterable[str]) -> tuple[str, ...]:
    """``"send,read"`` (or a list) -> ``("read", "send")``; unknown scopes are refused."""
    items = scopes.split(",") if isinstance(scopes, str) else list(scopes)
    found = {s.strip() for s in items if s.strip()}
    unknown = sorted(found - set(SCOPES))
    if unknown:
        raise ConfigurationError(f"unknown scope(s) {', '.join(unknown)} "
                                 f"(scopes: {', '.join(SCOPES)})")
    if not found:
        raise ConfigurationError(f"give at least one scope ({', '.join(SCOPES)})")
    return tuple(s for s in SCOPES if s in found)


async def create_key(store: ApiKeyStore, scopes: str | Iterable[str],
                     name: str = "") -> tuple[ApiKey, str]:
    """Create a key; returns it and its token (the only time the token exists in clear)."""
    granted = parse_scopes(scopes)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    key = await store.create_api_key(name or "unnamed", token[:PREFIX_CHARS], hash_token(token),
                                     granted)
    return key, token


async def authenticate(store: ApiKeyStore, token: str) -> ApiKey | None:
    """The active key whose token this is, or None (unknown, malformed or revoked)."""
    token = token.strip()
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    # Looked up by the hash: the database never compares the secret itself.
    key = await store.get_api_key(token_hash=hash_token(token))
    return key if key is not None and key.active else None
