"""Ambiguous reconciliation: a delivery the provider may have accepted gets no new attempt
until something settles it.

The provider settles it when it can be asked by key (a lookup) or deduplicates by key (a
retry with the same key cannot duplicate); a lane with ``on_ambiguous = "resend"`` settles it
by accepting a possible duplicate. Otherwise it stays held for an operator. A settled delivery
still obeys its retry budget: past its expiry or its attempts it is a dead letter, not resent.

With a fallback provider, the provider asked is the one the ambiguous attempt went to
(``worker.routes``), and one settled by that provider's deduplication is pinned there before it
goes back to pending: its retry must reach the same provider to be deduplicated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from postlane.core.lanes import LaneConfig
from postlane.core.message import Delivery
from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import effective_expiry
from postlane.core.records import Route, Transition
from postlane.core.states import DeadReason, State
from postlane.store.roles import WorkerStore
from postlane.worker.routes import ProviderRoute, attempted_at

log = logging.getLogger("postlane.worker")

BATCH = 100
"""Ambiguous deliveries looked at per round."""

DEDUPLICATES = "retry with the same key; the provider deduplicates"


class Reconciler:
    def __init__(self, store: WorkerStore, routes: Sequence[ProviderRoute],
                 lanes: Mapping[str, LaneConfig], wake: Callable[[], None]) -> None:
        self.store = store
        self.routes = list(routes)
        self.failover = len(self.routes) > 1
        self.lanes = lanes
        self.wake = wake
        """Called when deliveries went back to pending: the lanes should claim now."""

    async def reconcile(self) -> int:
        """Resolve ambiguous deliveries where the provider or the lane allows it; how many."""
        settles = any(r.traits.deduplicates_by_key or r.traits.can_lookup_by_key
                      for r in self.routes)
        lanes = [name for name, lane in self.lanes.items()
                 if settles or lane.on_ambiguous == "resend"]
        if not lanes:
            return 0
        resolved = []
        pins = []
        now = datetime.now(UTC)
        ambiguous = await self.store.list_ambiguous(BATCH, lanes=lanes,
                                                    channel=self.routes[0].provider.channel)
        recorded = (await self.store.delivery_routes([d.id for d in ambiguous])
                    if self.failover and ambiguous else {})
        for delivery in ambiguous:
            lane = self.lanes.get(delivery.lane)
            if lane is None:
                continue
            name = attempted_at(recorded.get(delivery.id), delivery.attempts)
            route = self.routes[0] if name is None else next(
                (r for r in self.routes if r.name == name), None)
            if route is None:  # sent through a provider this worker does not have
                continue
            transition = await self._resolution(delivery, lane, now, route)
            if transition is None:
                continue
            resolved.append(transition)
            if (self.failover and transition.state is State.PENDING
                    and transition.detail.get("resolution") == DEDUPLICATES):
                pins.append(Route(delivery.id, route.name, delivery.attempts, pinned=True))
        await self.store.record_routes(pins)  # before the state: never unpinned and pending
        applied = await self.store.set_state_if_ambiguous_many(resolved)
        if applied:
            log.info("reconciled %d ambiguous deliveries", len(applied))
            self.wake()
        return len(applied)

    async def _resolution(self, delivery: Delivery, lane: LaneConfig, now: datetime,
                          route: ProviderRoute) -> Transition | None:
        def to(state: State, event: str, why: str, **extra: object) -> Transition:
            return Transition(delivery.id, delivery.claims, state, event, delay_s=0.0,
                              spend_attempt=False,
                              detail={"resolution": why, "provider": route.name},
                              **extra)  # type: ignore[arg-type]

        traits = route.traits
        if traits.can_lookup_by_key:
            found = await route.provider.lookup(delivery.key)
            if found is not None and found.kind is OutcomeClass.ACCEPTED:
                return to(State.SENT, "reconciled", "the provider has it",
                          provider_message_id=found.provider_message_id)
            if found is not None:  # the lookup itself failed: ask again next round
                return None
            why = "the provider does not have it"
        elif traits.deduplicates_by_key:
            why = DEDUPLICATES
        else:
            why = "lane policy is resend: a duplicate is accepted"
        expires_at = effective_expiry(delivery, lane)
        if expires_at is not None and now >= expires_at:
            return to(State.EXPIRED, "expired", why, dead_reason=DeadReason.EXPIRED)
        if delivery.attempts >= lane.max_attempts:
            return to(State.DEAD, "dead_lettered", why, dead_reason=DeadReason.BUDGET_EXHAUSTED)
        return to(State.PENDING, "reconciled", why)
