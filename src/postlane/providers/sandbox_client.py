"""``sandbox+http://127.0.0.1:8025``: the client of ``postlane sandbox`` (the sandbox over HTTP).

It speaks the generic JSON protocol (``POST /v1/messages`` with ``Idempotency-Key``) and can
look a key up (``GET /v1/messages/{key}``), so an ambiguous send -- the sandbox's
accept-then-timeout -- is reconciled by asking. Its mapping is the sandbox's own table
(``postlane.providers.sandbox.outcome_of``) in HTTP terms: 200 accepted, 429 throttled with
Retry-After, 5xx transient, 400/404 permanent; a timeout after the request left is ambiguous.
Options: those of every HTTP adapter (``timeout``, ``connect_timeout``, ``pool``, ``from``,
``account``) and ``dedup_window`` (seconds, the server's default 86400).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.errors import ConfigurationError
from postlane.providers.base import Capabilities
from postlane.providers.http import (
    HttpApiProvider,
    generic_payload,
    http_options,
    json_body,
    response_text,
)
from postlane.providers.options import ProviderURL

DEFAULT_SENDER = "sandbox@postlane.invalid"


class SandboxHttpProvider(HttpApiProvider):
    name = "sandbox+http"
    needs_sender = False  # it falls back to DEFAULT_SENDER

    def __init__(self, base_url: str, *, dedup_window: timedelta = timedelta(days=1),
                 **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.capabilities = Capabilities(deduplicates_by_key=True, dedup_window=dedup_window,
                                         can_lookup_by_key=True)

    @classmethod
    def from_url(cls, url: str, **extra: Any) -> SandboxHttpProvider:
        parsed = ProviderURL.parse(url)
        if parsed.scheme not in ("sandbox+http", "sandbox+https") or not parsed.host:
            raise ConfigurationError(f"not a sandbox+http:// URL: {parsed.redacted!r}")
        window = parsed.number("dedup_window", 86400.0, minimum=1.0)
        options = http_options(parsed)
        parsed.finish()
        scheme = parsed.scheme.removeprefix("sandbox+")
        port = f":{parsed.port}" if parsed.port else ""
        return cls(f"{scheme}://{parsed.host}{port}", dedup_window=timedelta(seconds=window),
                   **options, **extra)

    @property
    def account(self) -> str:
        return self._account or f"sandbox:{httpx.URL(self.base_url).netloc.decode()}"

    async def check(self) -> str | None:
        """No-send probe for ``postlane check``: the sandbox answers its stats page."""
        assert self._client is not None, "provider not opened"
        try:
            response = await self._client.get(f"{self.base_url}/sandbox/stats")
        except httpx.HTTPError as exc:
            return f"cannot reach the sandbox: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return f"the sandbox answered {response.status_code} to GET /sandbox/stats"
        return None

    def build_request(self, delivery: Delivery) -> httpx.Request:
        # The sandbox takes any address it is given, a Unicode local part too.
        payload = generic_payload(delivery, self.default_sender or DEFAULT_SENDER, utf8=True)
        return self.client.build_request(
            "POST", f"{self.base_url}/v1/messages", json=payload,
            headers={"Idempotency-Key": delivery.key, "Accept": "application/json"},
        )

    async def lookup(self, key: str) -> Outcome | None:
        """``accepted`` if the sandbox has ``key``, ``None`` if not; a failed lookup is a
        (non-accepted) transient outcome, never an exception."""
        answer = await self.request("GET", f"{self.base_url}/v1/messages/{quote(key, safe='')}")
        if isinstance(answer, Outcome):
            return Outcome.transient(f"lookup failed: {answer.response}")
        if answer.status_code == 200:
            found = json_body(answer).get("id")
            return Outcome.accepted(str(found) if found else None, response_text(answer))
        if answer.status_code == 404:
            return None
        return Outcome.transient(f"lookup failed: {response_text(answer)}")
