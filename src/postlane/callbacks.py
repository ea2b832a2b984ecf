"""Status callbacks: what became of a delivery, told to the application without polling.

The application registers an endpoint (for every delivery, or for those one API key
produced) and receives signed events, Standard Webhooks style (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``), for deliveries sent, dead-lettered, bounced,
complained about and suppressed, with the key, lane, provider and cause.

They travel like deliveries do. A trigger on the timeline (migration 0008) writes one
outbox row per endpoint in the very transaction that writes the event which causes it, so
an event is never announced that did not happen, nor lost after it did. ``CallbackSender``
(run by every worker) claims due rows under a lease, posts them, and retries a failure with
exponential backoff and full jitter until its budget is spent, when it becomes a dead
callback that ``replay`` sends again. The ``webhook-id`` is the timeline event's id
(``evt_<id>``), the same on every attempt and replay: receivers deduplicate by it, since
delivery is at least once (a receiver that times out after reading gets the event again).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx

from postlane.core.policy import RetryPolicy, backoff_s, parse_retry_after
from postlane.core.records import (
    CALLBACK_TYPES,
    Callback,
    CallbackEndpoint,
    CallbackResult,
    bound_response,
)
from postlane.core.redaction import redact_url
from postlane.errors import ConfigurationError
from postlane.store.roles import ApiKeyStore, CallbackStore
from postlane.webhooks.signatures import sign_standard
from postlane.worker.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("postlane.callbacks")


@dataclass(frozen=True, slots=True)
class CallbackConfig:
    timeout_s: float = 10.0
    """Longest wait for a receiver's answer; past it the attempt failed (and is retried)."""
    max_attempts: int = 15
    """Attempts before a callback is dead: with the defaults, within about a day (the
    backoff ceilings add up to 23 hours; full jitter makes the expected wait half that)."""
    base_s: float = 5.0
    cap_s: float = 6 * 3600.0
    lease_s: float = 60.0
    """How long a claimed callback is hidden from other senders; longer than ``timeout_s``."""
    batch: int = 50
    interval_s: float = 1.0
    """Pause between two looks at the outbox when nothing was due."""


# -- registration (the CLI and the HTTP API call these) -------------------------------------
def new_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def check_endpoint(url: str, events: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The URL and event types as stored, or ``ConfigurationError`` saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"callback URL {redact_url(url)!r} must be http(s)://host/...")
    unknown = sorted(set(events) - set(CALLBACK_TYPES))
    if unknown:
        raise ConfigurationError(f"unknown callback event type {unknown[0]!r} "
                                 f"(known: {', '.join(CALLBACK_TYPES)})")
    return url, tuple(dict.fromkeys(events))


async def register_endpoint(
    store: CallbackStore, url: str, *, events: Sequence[str] = (),
    api_key_id: int | None = None, keys: ApiKeyStore | None = None,
) -> CallbackEndpoint:
    """Register an endpoint: for every delivery, or (``api_key_id``) for those that API key
    produced. The returned endpoint carries its secret: show it once."""
    url, events = check_endpoint(url, events)
    if api_key_id is not None and keys is not None:
        key = await keys.get_api_key(key_id=api_key_id)
        if key is None or not key.active:
            raise ConfigurationError(f"no active API key with id {api_key_id}")
    return await store.add_callback_endpoint(url, new_secret(), api_key_id, events)


# -- sending ------------------------------------------------------------------------------
class CallbackSender:
    """Drains the callback outbox: one loop per worker, any number of workers."""

    def __init__(self, store: CallbackStore, config: CallbackConfig = CallbackConfig(), *,
                 client: httpx.AsyncClient | None = None,
                 rand: Callable[[], float] = random.random,
                 now: Callable[[], float] = time.time, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.config = config
        self.rand = rand
        self.now = now
        self.clock = clock
        self.counters: Counter[str] = Counter()
        """Attempts by outcome (``sent``, ``retry``, ``dead``), for metrics."""
        self._client = client
        self._own_client = client is None
        self._policy = RetryPolicy(base_s=config.base_s, cap_s=config.cap_s)

    async def close(self) -> None:
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def step(self) -> bool:
        """One turn of the sender's loop: deliver what is due, else wait a little."""
        if not await self.deliver_due():
            await self.clock.sleep(self.config.interval_s)
        return False

    async def deliver_due(self) -> int:
        """Post every due callback (one batch); how many were attempted."""
        due = await self.store.claim_callbacks(self.config.batch, self.config.lease_s)
        if not due:
            return 0
        results = await asyncio.gather(*(self._attempt(callback) for callback in due))
        await self.store.finish_callbacks(results)
        for result in results:
            self.counters[result.outcome] += 1
        return len(due)

    async def _attempt(self, callback: Callback) -> CallbackResult:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        body = json.dumps(callback.payload, separators=(",", ":"), sort_keys=True).encode()
        timestamp = int(self.now())
        headers = {
            "content-type": "application/json",
            "user-agent": "Postlane-Callbacks",
            "webhook-id": callback.message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign_standard(callback.secret, callback.message_id,
                                               timestamp, body),
        }
        retry_after = None
        try:
            response = await self._client.post(callback.url, content=body, headers=headers,
                                               timeout=self.config.timeout_s)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            if 200 <= response.status_code < 300:
                return CallbackResult(callback.id, callback.attempts, "sent")
            error = f"HTTP {response.status_code}: {response.text[:200]}"
            retry_after = parse_retry_after(response.headers.get("retry-after"),
                                            datetime.now(UTC))
        error = bound_response(error) or "failed"
        if callback.attempts >= self.config.max_attempts:
            log.error("ALERT callback %s (%s of delivery %d) to %s is dead after %d attempts: "
                      "%s", callback.message_id, callback.type, callback.delivery_id,
                      redact_url(callback.url), callback.attempts, error)
            return CallbackResult(callback.id, callback.attempts, "dead", error=error)
        delay = backoff_s(callback.attempts, self._policy, self.rand)
        if retry_after is not None:
            delay = min(max(delay, retry_after), self.config.cap_s)
        log.warning("callback %s to %s failed (attempt %d): %s; again in %.1fs",
                    callback.message_id, redact_url(callback.url), callback.attempts, error,
                    delay)
        return CallbackResult(callback.id, callback.attempts, "retry", delay_s=delay,
                              error=error)
