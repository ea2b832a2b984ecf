"""The dashboard's session cookie: an API key id and an expiry, signed (HMAC-SHA256).

The cookie never holds the API key itself. Each request re-reads the key, so revoking it
ends its sessions at once. Signing out ends them on the server too, not only in the browser
that signed out: the key records when (``ApiKey.sessions_after``), and a cookie issued before
that is refused, even one copied before the sign-out. (That ends every session of the key,
in every browser: the cookie is stateless, so per-key is what a check can afford without a
look-up of its own.) Forms carry a CSRF token derived from the session, on top of the
cookie's ``SameSite=Strict``; signing out needs it too.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass

COOKIE = "postlane_session"
SECRET_ENV = "POSTLANE_SESSION_SECRET"
DEFAULT_MAX_AGE_S = 8 * 3600


@dataclass(frozen=True, slots=True)
class SessionCookie:
    key_id: int
    issued_at: float
    """Unix seconds, to the millisecond."""


class Sessions:
    def __init__(self, secret: str | bytes | None = None,
                 max_age_s: int = DEFAULT_MAX_AGE_S) -> None:
        """Without a secret (argument or ``$POSTLANE_SESSION_SECRET``) one is drawn per
        process: sessions then end when the server restarts, and several server processes
        behind one address need the same secret."""
        secret = secret or os.environ.get(SECRET_ENV) or secrets.token_bytes(32)
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self.max_age_s = max_age_s

    def _sign(self, payload: str) -> str:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, key_id: int, now: float | None = None) -> str:
        issued = time.time() if now is None else now
        expires = int(issued + self.max_age_s)
        payload = f"{key_id}.{int(issued * 1000)}.{expires}.{secrets.token_hex(8)}"
        return f"{payload}.{self._sign(payload)}"

    def read(self, value: str | None, now: float | None = None) -> SessionCookie | None:
        """The key id and issue time of a valid, unexpired session cookie, else None."""
        if not value or value.count(".") != 4:
            return None
        payload, _, signature = value.rpartition(".")
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        key_id, issued_ms, expires, _nonce = payload.split(".")
        if not (key_id.isdigit() and issued_ms.isdigit() and expires.isdigit()):
            return None
        if int(expires) < (time.time() if now is None else now):
            return None
        return SessionCookie(int(key_id), int(issued_ms) / 1000)

    def verify(self, value: str | None, now: float | None = None) -> int | None:
        """The API key id of a valid, unexpired session cookie, else None."""
        cookie = self.read(value, now)
        return cookie.key_id if cookie else None

    @staticmethod
    def signed_out(cookie: SessionCookie, sessions_after: float | None) -> bool:
        """Was the session issued before its key signed out (``ApiKey.sessions_after``)?"""
        return sessions_after is not None and cookie.issued_at < sessions_after

    def csrf_token(self, session: str) -> str:
        return self._sign("csrf:" + session)[:32]

    def check_csrf(self, session: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(session), token or "")
