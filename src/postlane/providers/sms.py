"""The SMS side of the provider seam, and an in-process sandbox that records what it sent.

An SMS adapter implements ``send_sms`` and owns the same mapping as an email adapter:
a delivery (``channel="sms"``, E.164 ``recipient``, ``text``, its idempotency key) into a
request, and the answer into an ``Outcome``. ``SmsProvider`` also implements ``send`` by
routing SMS deliveries to ``send_sms`` (and refusing email as permanent), so the worker
drives an SMS account exactly as it drives an email one; ``channel = "sms"`` makes its
worker claim SMS deliveries only.

Adapters: ``sandbox-sms://`` (below) and ``twilio://`` (``providers.twilio``).
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.sms import SMS_CHANNEL, count_segments
from postlane.providers.base import Capabilities, Provider
from postlane.providers.sandbox import SandboxConfig, SandboxEngine, outcome_of


class SmsProvider(Provider):
    """Base class of SMS adapters."""

    name = "sms"
    channel = SMS_CHANNEL

    @abc.abstractmethod
    async def send_sms(self, delivery: Delivery) -> Outcome:
        """Send ``delivery.text`` to ``delivery.recipient`` with ``delivery.key`` as the
        idempotency key."""

    async def send(self, delivery: Delivery) -> Outcome:
        if delivery.channel != SMS_CHANNEL:
            return Outcome.permanent(
                f"{self.name} sends SMS only; delivery {delivery.id} is {delivery.channel!r}")
        return await self.send_sms(delivery)


@dataclass(frozen=True, slots=True)
class SmsRecord:
    key: str
    delivery_id: int
    to: str
    text: str
    segments: int
    encoding: str
    provider_id: str


class SandboxSmsProvider(SmsProvider):
    """``sandbox-sms://``: the email sandbox's engine (``providers.sandbox``) carrying texts.

    The same fault options as ``sandbox://`` (``rate``, ``error_rate``, ``throttle_rate``,
    ``timeout_rate``, ``reject`` -- a pattern matched against the phone number --,
    ``dedup_window_s``, ``latency_s``, ``seed``...), answered the same way. It counts
    segments as a carrier would and deduplicates by key: ``sent`` holds one record per
    message accepted; a repeat of an accepted key returns the original id and only counts in
    ``duplicates_suppressed``. ``segments_billed`` is what the account would pay for.
    """

    name = "sandbox-sms"

    def __init__(self, config: SandboxConfig = SandboxConfig()) -> None:
        self.engine = SandboxEngine(config)
        self.engine.on_accept = self._record
        self.capabilities = Capabilities(
            deduplicates_by_key=True, dedup_window=timedelta(seconds=config.dedup_window_s),
            can_lookup_by_key=True)
        self.sent: list[SmsRecord] = []
        self.by_key: dict[str, SmsRecord] = {}
        self._sending: Delivery | None = None

    @classmethod
    def from_url(cls, url: str) -> SandboxSmsProvider:
        return cls(SandboxConfig.from_query(urlsplit(url).query))

    @property
    def duplicates_suppressed(self) -> int:
        return self.engine.stats.duplicates_suppressed

    @property
    def segments_billed(self) -> int:
        return sum(r.segments for r in self.sent)

    def _record(self, key: str, provider_id: str, to: str) -> None:
        delivery = self._sending
        assert delivery is not None and delivery.key == key
        text = delivery.text or ""
        segments = count_segments(text)
        record = SmsRecord(key, delivery.id, to, text, segments.segments, segments.encoding,
                           provider_id)
        self.sent.append(record)
        self.by_key[key] = record

    async def send_sms(self, delivery: Delivery) -> Outcome:
        if not delivery.text:
            return Outcome.permanent("400 an SMS needs a text")
        config = self.engine.config
        if config.latency_s:
            await asyncio.sleep(config.latency_s)
        self._sending = delivery  # submit is synchronous: no other send runs in between
        try:
            answer = self.engine.submit(delivery.key, delivery.recipient)
        finally:
            self._sending = None
        if answer.hang and config.timeout_delay_s:
            await asyncio.sleep(config.timeout_delay_s)
        return outcome_of(answer)

    async def lookup(self, key: str) -> Outcome | None:
        found = self.engine.lookup(key)
        return Outcome.accepted(found) if found else None

    def stats(self) -> dict[str, Any]:
        return {**self.engine.stats.as_json(), "segments_billed": self.segments_billed}
