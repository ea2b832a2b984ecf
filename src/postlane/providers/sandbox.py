"""A sandbox provider that behaves like a real ESP, for demos, staging and load tests.

It enforces an account rate limit (429 with Retry-After), answers a configurable share of
requests with 503, accepts some and then never answers in time (accept-then-timeout),
rejects addresses matching a pattern (400) and unknown templates (404), and honours
idempotency keys for a while (a repeat returns the original result and is counted as a
suppressed duplicate). It keeps what it saw, so a test or an operator can check what really
reached it: ``stats()``.

``sandbox://?rate=100&error_rate=0.02&timeout_rate=0.01&reject=^bounce&seed=7`` runs it
in-process; ``postlane sandbox`` serves the same engine over HTTP.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass, Phase
from postlane.errors import ConfigurationError
from postlane.providers.base import Capabilities, Provider
from postlane.providers.mime import wire_headers
from postlane.providers.progress import current_progress


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    rate: float | None = None
    """Account ceiling in sends per second (calendar-second windows); None: unlimited."""
    error_rate: float = 0.0
    """Share of requests answered 503."""
    throttle_rate: float = 0.0
    """Share of requests answered 429 at random (besides the rate limit itself)."""
    timeout_rate: float = 0.0
    """Share of requests accepted and then not answered in time."""
    timeout_delay_s: float = 0.0
    """How long the in-process sandbox sits on an accept-then-timeout before saying so."""
    reject: str | None = None
    """Recipients matching this regular expression are rejected with 400."""
    unknown_templates: frozenset[str] = frozenset()
    """Template ids answered with 404."""
    dedup_window_s: float = 86400.0
    retry_after_s: float = 1.0
    """Retry-After of a random 429."""
    latency_s: float = 0.0
    seed: int | None = None
    account: str = ""
    """The account name (limiter key, breaker): two sandboxes in one worker, as a primary and
    its fallback, need two; default ``sandbox``."""

    @classmethod
    def from_query(cls, query: str) -> SandboxConfig:
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(params) - known
        if unknown:
            raise ConfigurationError(
                f"unknown sandbox options {sorted(unknown)} (known: {sorted(known)})"
            )
        values: dict[str, Any] = {}
        try:
            for name, raw in params.items():
                if name == "account":
                    values[name] = raw
                elif name == "reject":
                    re.compile(raw)
                    values[name] = raw
                elif name == "unknown_templates":
                    values[name] = frozenset(t for t in raw.split(",") if t)
                elif name == "seed":
                    values[name] = int(raw)
                else:
                    values[name] = float(raw)
        except (ValueError, re.error) as exc:
            raise ConfigurationError(f"bad sandbox option: {exc}") from None
        for name in ("error_rate", "throttle_rate", "timeout_rate"):
            if not 0 <= values.get(name, 0.0) <= 1:
                raise ConfigurationError(f"sandbox {name} must be between 0 and 1")
        return cls(**values)


@dataclass
class SandboxStats:
    accepted: int = 0
    duplicates_suppressed: int = 0
    rejected: int = 0
    throttled: int = 0
    errors: int = 0
    timeouts: int = 0
    requests: int = 0
    by_second: Counter[int] = field(default_factory=Counter)
    """Accepted sends per unix second: the provider-side measure of the ceiling."""

    def as_json(self, accepted_keys: list[str] | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "accepted": self.accepted, "duplicates_suppressed": self.duplicates_suppressed,
            "rejected": self.rejected, "throttled": self.throttled, "errors": self.errors,
            "timeouts": self.timeouts, "requests": self.requests,
            "by_second": {str(k): v for k, v in sorted(self.by_second.items())},
            "max_per_second": max(self.by_second.values(), default=0),
        }
        if accepted_keys is not None:
            data["accepted_keys"] = accepted_keys
        return data


@dataclass(frozen=True, slots=True)
class SandboxAnswer:
    """What the sandbox answers, in HTTP terms (the HTTP server sends exactly this)."""

    status: int
    body: dict[str, Any]
    retry_after_s: float | None = None
    hang: bool = False
    """Accepted, but the answer should not arrive before the client's timeout."""


class SandboxEngine:
    """The provider's own state: accounts, keys, counters. No I/O."""

    def __init__(self, config: SandboxConfig = SandboxConfig(),
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.random = random.Random(config.seed)
        self._reject = re.compile(config.reject) if config.reject else None
        self.stats = SandboxStats()
        self._keys: dict[str, tuple[float, str]] = {}
        self._window: tuple[int, int] = (0, 0)  # (second, sends accepted in it)
        self._ids = 0
        self.on_accept: Callable[[str, str, str], None] | None = None
        """Called with (key, message id, recipient) for each acceptance: delivery events."""
        self.attachments: dict[str, list[dict[str, Any]]] = {}
        """What each accepted key carried: every part's filename, content type, kind and size
        (never the bytes), as a real provider's message log shows them."""

    def submit(self, key: str, to: str, template_id: str | None = None,
               attachments: Sequence[Mapping[str, Any]] = ()) -> SandboxAnswer:
        now = self.clock()
        self.stats.requests += 1
        known = self._keys.get(key)
        if known is not None and now - known[0] < self.config.dedup_window_s:
            self.stats.duplicates_suppressed += 1
            return SandboxAnswer(200, {"id": known[1], "duplicate": True})
        if self.config.rate is not None:
            second = math.floor(now)
            count = self._window[1] if self._window[0] == second else 0
            if count >= self.config.rate:
                self.stats.throttled += 1
                return SandboxAnswer(429, {"error": "rate limit exceeded"},
                                     retry_after_s=max(0.001, second + 1 - now))
        roll = self.random.random()
        if roll < self.config.throttle_rate:
            self.stats.throttled += 1
            return SandboxAnswer(429, {"error": "slow down"},
                                 retry_after_s=self.config.retry_after_s)
        roll -= self.config.throttle_rate
        if roll < self.config.error_rate:
            self.stats.errors += 1
            return SandboxAnswer(503, {"error": "service unavailable"})
        if self._reject is not None and self._reject.search(to):
            self.stats.rejected += 1
            return SandboxAnswer(400, {"error": f"recipient rejected: {to}"})
        if template_id is not None and template_id in self.config.unknown_templates:
            self.stats.rejected += 1
            return SandboxAnswer(404, {"error": f"unknown template {template_id}"})
        message_id = self._accept(key, now)
        if attachments:
            self.attachments[key] = [
                {"filename": a["filename"], "content_type": a["content_type"],
                 "kind": a.get("kind", "attachment"), "size": int(a["size"])}
                for a in attachments]
        if self.on_accept is not None:
            self.on_accept(key, message_id, to)
        roll -= self.config.error_rate
        if roll < self.config.timeout_rate:
            self.stats.timeouts += 1
            return SandboxAnswer(200, {"id": message_id}, hang=True)
        return SandboxAnswer(200, {"id": message_id})

    def _accept(self, key: str, now: float) -> str:
        self._ids += 1
        message_id = f"sbx-{self._ids}"
        self._keys[key] = (now, message_id)
        second = math.floor(now)
        count = self._window[1] if self._window[0] == second else 0
        self._window = (second, count + 1)
        self.stats.accepted += 1
        self.stats.by_second[second] += 1
        return message_id

    def lookup(self, key: str) -> str | None:
        known = self._keys.get(key)
        return known[1] if known else None

    def accepted_keys(self) -> list[str]:
        return list(self._keys)


def outcome_of(answer: SandboxAnswer) -> Outcome:
    """The sandbox's mapping table, shared by the in-process and the HTTP adapter."""
    text = str(answer.body.get("error") or answer.body.get("id"))
    response = f"{answer.status} {text}"
    if answer.status == 200:
        if answer.hang:
            return Outcome.ambiguous("accepted, but no answer before the timeout")
        return Outcome.accepted(str(answer.body["id"]), response)
    if answer.status == 429:
        return Outcome.throttled(answer.retry_after_s, response)
    if answer.status >= 500:
        return Outcome.transient(response)
    if answer.status in (401, 403):  # the account's credentials, as over HTTP
        return Outcome.account(response, answer.retry_after_s)
    if answer.retry_after_s is not None:  # "later", not "never"
        return Outcome.throttled(answer.retry_after_s, response)
    return Outcome(OutcomeClass.PERMANENT, response=response)


class SandboxProvider(Provider):
    """``sandbox://``: the engine in this process."""

    name = "sandbox"

    def __init__(self, config: SandboxConfig = SandboxConfig(),
                 engine: SandboxEngine | None = None) -> None:
        self.engine = engine or SandboxEngine(config)
        self.capabilities = Capabilities(
            deduplicates_by_key=True,
            dedup_window=timedelta(seconds=self.engine.config.dedup_window_s),
            can_lookup_by_key=True,
        )
        self.sample_headers: dict[str, dict[str, str]] = {}
        """Per lane, the headers of the first message accepted (``wire_headers``), so a demo
        can show what a bulk message carried (its ``List-Unsubscribe``)."""

    @property
    def account(self) -> str:
        return self.engine.config.account or self.name

    def with_config(self, **changes: Any) -> SandboxProvider:
        return SandboxProvider(replace(self.engine.config, **changes))

    async def send(self, delivery: Delivery) -> Outcome:
        """The latency is the request on its way (cut off there, the engine never saw it);
        the engine's ``submit`` is the point of no return, as a real provider's read of the
        whole request is."""
        config = self.engine.config
        progress = current_progress()
        progress.reach(Phase.REQUEST)
        if config.latency_s:
            await asyncio.sleep(config.latency_s)
        progress.reach(Phase.RESPONSE)
        answer = self.engine.submit(delivery.key, delivery.recipient, delivery.template_id,
                                    [part.describe() for part in delivery.attachments])
        if answer.status == 200 and delivery.lane not in self.sample_headers:
            self.sample_headers[delivery.lane] = wire_headers(delivery)
        if answer.hang and config.timeout_delay_s:
            await asyncio.sleep(config.timeout_delay_s)
        return outcome_of(answer).at(Phase.RESPONSE)

    async def lookup(self, key: str) -> Outcome | None:
        found = self.engine.lookup(key)
        return Outcome.accepted(found) if found else None
