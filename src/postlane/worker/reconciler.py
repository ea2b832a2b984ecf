"""Ambiguous reconciliation: a delivery the provider may have accepted gets no new attempt
until something settles it.

The provider settles it when it can be asked by key (a lookup) or deduplicates by key (a
retry with the same key cannot duplicate); a lane with ``on_ambiguous = "resend"`` settles it
by accepting a possible duplicate. Otherwise it stays held for an operator. A settled delivery
still obeys its retry budget: past its expiry or its attempts it is a dead letter, not resent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from postlane.core.lanes import LaneConfig
from postlane.core.message import Delivery
from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import ProviderTraits, effective_expiry
from postlane.core.records import Transition
from postlane.core.states import DeadReason, State
from postlane.providers.base import Provider
from postlane.store.roles import WorkerStore

log = logging.getLogger("postlane.worker")

BATCH = 100
"""Ambiguous deliveries looked at per round."""


class Reconciler:
    def __init__(self, store: WorkerStore, provider: Provider, traits: ProviderTraits,
                 lanes: Mapping[str, LaneConfig], wake: Callable[[], None]) -> None:
        self.store = store
        self.provider = provider
        self.traits = traits
        self.lanes = lanes
        self.wake = wake
        """Called when deliveries went back to pending: the lanes should claim now."""

    async def reconcile(self) -> int:
        """Resolve ambiguous deliveries where the provider or the lane allows it; how many."""
        lanes = [name for name, lane in self.lanes.items()
                 if self.traits.deduplicates_by_key or self.traits.can_lookup_by_key
                 or lane.on_ambiguous == "resend"]
        if not lanes:
            return 0
        resolved = []
        now = datetime.now(UTC)
        for delivery in await self.store.list_ambiguous(BATCH, lanes=lanes,
                                                        channel=self.provider.channel):
            lane = self.lanes.get(delivery.lane)
            if lane is None:
                continue
            transition = await self._resolution(delivery, lane, now)
            if transition is not None:
                resolved.append(transition)
        applied = await self.store.set_state_if_ambiguous_many(resolved)
        if applied:
            log.info("reconciled %d ambiguous deliveries", len(applied))
            self.wake()
        return len(applied)

    async def _resolution(self, delivery: Delivery, lane: LaneConfig,
                          now: datetime) -> Transition | None:
        def to(state: State, event: str, why: str, **extra: object) -> Transition:
            return Transition(delivery.id, delivery.claims, state, event, delay_s=0.0,
                              spend_attempt=False, detail={"resolution": why},
                              **extra)  # type: ignore[arg-type]

        if self.traits.can_lookup_by_key:
            found = await self.provider.lookup(delivery.key)
            if found is not None and found.kind is OutcomeClass.ACCEPTED:
                return to(State.SENT, "reconciled", "the provider has it",
                          provider_message_id=found.provider_message_id)
            if found is not None:  # the lookup itself failed: ask again next round
                return None
            why = "the provider does not have it"
        elif self.traits.deduplicates_by_key:
            why = "retry with the same key; the provider deduplicates"
        else:
            why = "lane policy is resend: a duplicate is accepted"
        expires_at = effective_expiry(delivery, lane)
        if expires_at is not None and now >= expires_at:
            return to(State.EXPIRED, "expired", why, dead_reason=DeadReason.EXPIRED)
        if delivery.attempts >= lane.max_attempts:
            return to(State.DEAD, "dead_lettered", why, dead_reason=DeadReason.BUDGET_EXHAUSTED)
        return to(State.PENDING, "reconciled", why)
