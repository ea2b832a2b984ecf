"""The dashboard's session cookie: an API key id and an expiry, signed (HMAC-SHA256).

The cookie never holds the API key itself. Each request re-reads the key, so revoking it
ends its sessions at once. Forms carry a CSRF token derived from the session, on top of the
cookie's ``SameSite=Strict``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time

COOKIE = "postlane_session"
SECRET_ENV = "POSTLANE_SESSION_SECRET"
DEFAULT_MAX_AGE_S = 8 * 3600


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
        expires = int((now or time.time()) + self.max_age_s)
        payload = f"{key_id}.{expires}.{secrets.token_hex(8)}"
        return f"{payload}.{self._sign(payload)}"

    def verify(self, value: str | None, now: float | None = None) -> int | None:
        """The API key id of a valid, unexpired session cookie, else None."""
        if not value or value.count(".") != 3:
            return None
        payload, _, signature = value.rpartition(".")
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        key_id, expires, _nonce = payload.split(".")
        if not (key_id.isdigit() and expires.isdigit()) or int(expires) < (now or time.time()):
            return None
        return int(key_id)

    def csrf_token(self, session: str) -> str:
        return self._sign("csrf:" + session)[:32]

    def check_csrf(self, session: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(session), token or "")
