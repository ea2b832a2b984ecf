"""One-click unsubscribe (RFC 8058): the signed token, the two headers, and which mail
carries them.

A message of a lane marked bulk carries::

    List-Unsubscribe: <https://mail.example.com/unsubscribe/TOKEN>,
     <mailto:unsubscribe@example.com?subject=unsubscribe%20TOKEN>
    List-Unsubscribe-Post: List-Unsubscribe=One-Click

``TOKEN`` names the recipient, the stream (the lane) and the delivery, and is signed with
HMAC-SHA256 under ``POSTLANE_UNSUBSCRIBE_SECRET``: it is the only credential the one-click
POST needs, so nobody can unsubscribe an address they did not receive mail for. The token
is deterministic (no time in it): every attempt and replay of a delivery sends the same
bytes, and a link keeps working as long as the secret does (several secrets, comma-separated,
verify during a rotation; the first signs).

Transactional lanes never carry the headers: a password reset is not a list. A template can
be exempted within a bulk lane (a notice the recipient cannot opt out of).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from urllib.parse import urlsplit

from postlane.errors import ConfigurationError

SECRET_ENV = "POSTLANE_UNSUBSCRIBE_SECRET"
URL_ENV = "POSTLANE_UNSUBSCRIBE_URL"
MAILTO_ENV = "POSTLANE_UNSUBSCRIBE_MAILTO"
PATH = "/unsubscribe/"
"""Where ``postlane serve`` answers the one-click POST (and shows the confirmation page)."""
ONE_CLICK = "List-Unsubscribe=One-Click"
MIN_SECRET_BYTES = 16
_CONTEXT = b"postlane-unsubscribe-v1."


class InvalidToken(ValueError):
    """The token is malformed or its signature does not verify under any secret."""


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified token says: whom to unsubscribe from what."""

    address: str
    stream: str
    delivery_id: int | None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, _CONTEXT + payload.encode("ascii"), hashlib.sha256).digest())


def sign(secret: bytes, address: str, stream: str, delivery_id: int | None) -> str:
    """``payload.signature``, both base64url: safe in a URL path and a mailto subject."""
    payload = _b64(json.dumps([address.lower(), stream, delivery_id],
                              separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    return f"{payload}.{_mac(secret, payload)}"


def verify(secrets: Sequence[bytes], token: str) -> TokenClaims:
    """The claims of a token signed under one of ``secrets``; raises ``InvalidToken``."""
    payload, dot, signature = token.strip().partition(".")
    if not dot or not payload or not signature or len(token) > 2048:
        raise InvalidToken("not an unsubscribe token")
    try:
        expected = [_mac(secret, payload) for secret in secrets]
    except UnicodeEncodeError:
        raise InvalidToken("not an unsubscribe token") from None
    if not any(hmac.compare_digest(signature, mac) for mac in expected):
        raise InvalidToken("the token's signature does not verify")
    try:
        address, stream, delivery_id = json.loads(_unb64(payload))
    except (ValueError, TypeError):
        raise InvalidToken("the token's payload cannot be read") from None
    if (not isinstance(address, str) or not isinstance(stream, str)
            or not (delivery_id is None or isinstance(delivery_id, int))):
        raise InvalidToken("the token's payload cannot be read")
    return TokenClaims(address, stream, delivery_id)


def parse_secrets(raw: str) -> tuple[bytes, ...]:
    """Comma-separated secrets (the first signs, all verify); each at least 16 bytes."""
    secrets = tuple(s.strip().encode("utf-8") for s in raw.split(",") if s.strip())
    for secret in secrets:
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigurationError(f"{SECRET_ENV}: each secret needs at least "
                                     f"{MIN_SECRET_BYTES} bytes (e.g. `openssl rand -hex 32`)")
    return secrets


def secrets_from_env() -> tuple[bytes, ...]:
    return parse_secrets(os.environ.get(SECRET_ENV, ""))


def check_base_url(url: str) -> str:
    """The public base URL of ``postlane serve``: https (RFC 8058 requires it), or http on a
    loopback host for local trials."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigurationError(f"unsubscribe URL {url!r} is not an https:// URL with a host")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ConfigurationError(f"unsubscribe URL {url!r}: one-click unsubscribe needs "
                                 "https (RFC 8058); plain http only on a loopback host")
    if parts.query or parts.fragment:
        raise ConfigurationError(f"unsubscribe URL {url!r}: give the base URL only "
                                 "(no query or fragment)")
    return url.rstrip("/")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ListUnsubscribe:
    """The two headers of one message."""

    url: str
    mailto: str | None = None

    def headers(self) -> dict[str, str]:
        targets = [f"<{self.url}>"] + ([f"<{self.mailto}>"] if self.mailto else [])
        return {"List-Unsubscribe": ", ".join(targets), "List-Unsubscribe-Post": ONE_CLICK}


@dataclass(frozen=True, slots=True)
class UnsubscribeConfig:
    """Where the links point and what signs them; which mail carries them is the lanes'
    ``bulk`` flag and ``exempt_templates``."""

    secrets: tuple[bytes, ...]
    base_url: str
    mailbox: str | None = None
    """An address for the mailto form (``unsubscribe@example.com``); None: https only."""
    exempt_templates: frozenset[str] = frozenset()
    """Templates whose messages never carry the headers, even in a bulk lane."""

    def __post_init__(self) -> None:
        if not self.secrets:
            raise ConfigurationError(f"one-click unsubscribe needs a signing secret: set "
                                     f"{SECRET_ENV} (e.g. `openssl rand -hex 32`)")
        check_base_url(self.base_url)
        if self.mailbox is not None and ("@" not in self.mailbox or "?" in self.mailbox
                                         or any(c in self.mailbox for c in "<>, ")):
            raise ConfigurationError(f"unsubscribe mailbox {self.mailbox!r} is not an address")

    @classmethod
    def from_env(cls, base_url: str | None = None, mailbox: str | None = None,
                 exempt_templates: Collection[str] = ()) -> UnsubscribeConfig | None:
        """From the options given, else ``POSTLANE_UNSUBSCRIBE_URL`` and
        ``POSTLANE_UNSUBSCRIBE_MAILTO``, signed with ``POSTLANE_UNSUBSCRIBE_SECRET``. None
        when no URL is configured (bulk mail then goes without the headers)."""
        url = base_url or os.environ.get(URL_ENV, "").strip()
        if not url:
            return None
        box = mailbox or os.environ.get(MAILTO_ENV, "").strip() or None
        return cls(secrets_from_env(), check_base_url(url), box,
                   frozenset(exempt_templates))

    def token(self, address: str, stream: str, delivery_id: int | None) -> str:
        return sign(self.secrets[0], address, stream, delivery_id)

    def verify(self, token: str) -> TokenClaims:
        return verify(self.secrets, token)

    def for_recipient(self, address: str, stream: str,
                      delivery_id: int | None) -> ListUnsubscribe:
        token = self.token(address, stream, delivery_id)
        mailto = (f"mailto:{self.mailbox}?subject=unsubscribe%20{token}"
                  if self.mailbox else None)
        return ListUnsubscribe(f"{self.base_url}{PATH}{token}", mailto)

    def applies(self, bulk_lane: bool, template_id: str | None) -> bool:
        """Whether a message carries the headers: bulk lanes only, less exempt templates."""
        return bulk_lane and (template_id is None or template_id not in self.exempt_templates)


def token_in_subject(subject: str) -> str | None:
    """The token of a mailto unsubscribe (``unsubscribe TOKEN``, any ``Re:`` before it)."""
    words = subject.split()
    for i, word in enumerate(words[:-1]):
        if word.lower() == "unsubscribe":
            return words[i + 1]
    return None
