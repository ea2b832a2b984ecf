"""The SMS side of the provider seam, and an in-process sandbox that records what it sent.

An SMS adapter implements ``send_sms`` and owns the same mapping as an email adapter:
a delivery (``channel="sms"``, E.164 ``recipient``, ``text``, its idempotency key) into a
request, and the answer into an ``Outcome``. ``SmsProvider`` also implements ``send`` by
routing SMS deliveries to ``send_sms`` (and refusing email as permanent), so the worker
drives an SMS account exactly as it drives an email one.
"""

from __future__ import annotations

import abc
import itertools
from dataclasses import dataclass

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.sms import SMS_CHANNEL, count_segments
from postlane.providers.base import Capabilities, Provider


class SmsProvider(Provider):
    """Base class of SMS adapters."""

    name = "sms"

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
    """Accepts every SMS, counts its segments as a carrier would, and deduplicates by key.

    ``sent`` holds one record per message accepted; a repeat of an accepted key returns
    the original id and only counts in ``duplicates_suppressed``. ``segments_billed`` is
    what the account would pay for.
    """

    name = "sandbox-sms"
    capabilities = Capabilities(deduplicates_by_key=True, can_lookup_by_key=True)

    def __init__(self) -> None:
        self.sent: list[SmsRecord] = []
        self.by_key: dict[str, SmsRecord] = {}
        self.duplicates_suppressed = 0
        self._ids = itertools.count(1)

    @property
    def segments_billed(self) -> int:
        return sum(r.segments for r in self.sent)

    async def send_sms(self, delivery: Delivery) -> Outcome:
        if not delivery.text:
            return Outcome.permanent("400 an SMS needs a text")
        known = self.by_key.get(delivery.key)
        if known is not None:
            self.duplicates_suppressed += 1
            return Outcome.accepted(known.provider_id)
        segments = count_segments(delivery.text)
        record = SmsRecord(delivery.key, delivery.id, delivery.recipient, delivery.text,
                           segments.segments, segments.encoding, f"sms-{next(self._ids)}")
        self.sent.append(record)
        self.by_key[delivery.key] = record
        return Outcome.accepted(record.provider_id)

    async def lookup(self, key: str) -> Outcome | None:
        known = self.by_key.get(key)
        return Outcome.accepted(known.provider_id) if known else None
