"""The dispatch worker: claims deliveries per lane, sends them within the global limit,
and reports every outcome back to the store, guarded by its lease.

One ``Worker`` runs these loops in one task group, each supervised the same way
(``worker.supervisor``: a failing turn is logged, counted and retried with a growing wait):

- a *lane loop* per lane (here): claims batches while the lane has slots (its floor, or
  idle slots lent by another lane), then dispatches them, each send paced by the
  ``Pacer`` (``worker.pacer``);
- the *waker* (here): waits on the store's enqueue signal (LISTEN/NOTIFY on PostgreSQL)
  and wakes idle lanes;
- the *acker* (``worker.acker``): writes outcomes in batches, one statement per flush;
- the *lease keeper* (here): renews the leases of everything held, so slow sends keep
  their claim;
- the *caretaker* (``worker.caretaker``): reads the fleet's controls (pauses, breaker),
  rescues expired leases, reconciles ambiguous deliveries (``worker.reconciler``), and in
  ``drain`` mode notices when all is done.

Every wait goes through one injected ``Clock`` (``worker.clock``), so timing rules are
tested without real time passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
import random
import socket
import traceback
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from postlane import tracing
from postlane.core.breaker import BreakerConfig
from postlane.core.lanes import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LANES,
    LaneConfig,
    check_lanes,
    slot_floors,
    start_capacity,
)
from postlane.core.message import EMAIL, Delivery
from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import (
    Decision,
    RetryPolicy,
    decide,
    expire_if_useless,
    handler_error,
)
from postlane.core.records import Claim, Route, Transition
from postlane.core.states import DeadReason, State
from postlane.core.unsubscribe import SECRET_ENV, UnsubscribeConfig
from postlane.core.validation import redact_address
from postlane.errors import ConfigurationError
from postlane.limiter.base import RateLimiter
from postlane.providers.base import Provider
from postlane.store.roles import WorkerStore
from postlane.worker.acker import Acker
from postlane.worker.attempt import Attempt
from postlane.worker.breaker import FleetBreaker
from postlane.worker.caretaker import Caretaker
from postlane.worker.clock import SYSTEM_CLOCK, Clock
from postlane.worker.controls import FleetControls
from postlane.worker.heartbeat import Heartbeat
from postlane.worker.housekeeping import Housekeeping
from postlane.worker.pacer import Pacer
from postlane.worker.poison import unreadable_decision
from postlane.worker.reconciler import Reconciler
from postlane.worker.routes import ProviderRoute, deciding_traits, traits_of
from postlane.worker.supervisor import supervise

if TYPE_CHECKING:
    from postlane.callbacks import CallbackSender

log = logging.getLogger("postlane.worker")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    concurrency: int = DEFAULT_CONCURRENCY
    lanes: tuple[LaneConfig, ...] = DEFAULT_LANES
    batch_size: int = 100
    lease: timedelta = timedelta(seconds=30)
    attempt_timeout_s: float = 10.0
    """For lanes that set no ``attempt_timeout_s`` of their own (the default lanes do)."""
    poll_interval_s: float = 1.0
    grace_s: float = 10.0
    rescue_interval_s: float = 2.0
    controls_interval_s: float = 0.5
    ack_interval_s: float = 0.005
    limiter_horizon_s: float = 0.2
    """How far ahead a lane books send slots at the limiter. Every lane shares one ceiling, so
    a message of another lane queues behind what is booked; bulk lanes book only half as far
    (``worker.pacer``: a tenth of a second, a hundred limiter round trips ahead of the send),
    so a reset takes a slot at once, about a tenth of a second out."""
    late_slot_s: float = 0.015
    """A send slot possibly missed by more than this (the event loop stalled, or the limiter's
    answer was slow) is not used late; the send takes a fresh slot. Keep it under the limiter's
    headroom in seconds (2 % = 20 ms): sends spread further from their slots than the headroom
    can overfill a one-second window at the provider."""
    heartbeat_interval_s: float = 5.0
    """Between two heartbeats (who this worker is, and its outcomes since the last one) in
    the database; three missed ones and the dashboard shows the worker as gone."""
    drain: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff for lanes that set no ``retry_base_s`` / ``retry_cap_s`` of their own."""
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    unsubscribe: UnsubscribeConfig | None = None
    """Signs the one-click unsubscribe headers of bulk lanes' mail (``core.unsubscribe``);
    None: bulk mail goes without them (a warning says so at start)."""


def send_extra(delivery: Delivery, provider_message_id: str | None = None,
               attempt: object = None) -> dict[str, object]:
    """``extra=`` for a log line about one send: the JSON log format writes these as fields
    (``postlane.logs.SEND_FIELDS``); never the address, which stays redacted in the text."""
    extra: dict[str, object] = {"delivery_id": delivery.id, "lane": delivery.lane}
    if provider_message_id is not None:
        extra["provider_message_id"] = provider_message_id
    if isinstance(attempt, int):
        extra["attempt"] = attempt
    return extra


Observer = Callable[[Delivery, Decision], None]
ClaimObserver = Callable[[str, list[Delivery]], None]
"""Sees each outcome as decided: the delivery as claimed and the decision (its ``detail``
carries ``outcome`` and ``duration_ms`` for sends)."""


HELD_SECONDS = 2.0
"""Under a rate limit a worker holds at most this many seconds of sends: claims beyond what
the ceiling lets out soon would sit leased in one process while others stand idle."""


def held_slots(config: WorkerConfig, limiter: RateLimiter | None) -> int:
    """The send slots the lanes share: the concurrency, capped by the ceiling."""
    if limiter is None:
        return config.concurrency
    by_rate = math.ceil(limiter.rate * HELD_SECONDS)
    return min(config.concurrency, max(len(config.lanes), by_rate))


def _provider_label(provider: Provider) -> str:
    """The provider as the workers page shows it: its name, and its account when that
    says more (two SES regions, two SMTP relays)."""
    account = provider.account
    return provider.name if account in ("", provider.name) else f"{provider.name} ({account})"


def make_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self,
        store: WorkerStore,
        provider: Provider,
        *,
        limiter: RateLimiter | None = None,
        fallbacks: Sequence[tuple[Provider, RateLimiter | None]] = (),
        callbacks: CallbackSender | None = None,
        config: WorkerConfig = WorkerConfig(),
        rand: Callable[[], float] = random.random,
        owner: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        check_lanes(config.lanes)
        self.store = store
        self.provider = provider
        self.limiter = limiter
        self.config = config
        self.rand = rand
        self.clock = clock
        self.owner = owner or make_owner()
        self.lanes = {lane.name: lane for lane in config.lanes}
        self.floors = slot_floors(config.lanes, held_slots(config, limiter))
        self.controls = FleetControls(store)
        self.counters: Counter[str] = Counter()
        self.callbacks = callbacks
        """Posts the status callbacks the timeline queued (``postlane.callbacks``)."""
        self.observers: list[Observer] = []
        """Called with every decided outcome (metrics hang off this); must not block."""
        self.claim_observers: list[ClaimObserver] = []
        """Called with each claimed batch and its lane (the claim age); must not block."""

        self._held: dict[int, Claim] = {}
        """Every claim this worker holds a lease for, until its outcome is written."""
        self.acker = Acker(store, self.owner, self._held, self.counters,
                           batch_size=config.batch_size, interval_s=config.ack_interval_s,
                           clock=clock)
        self.routes = [self._route(i, p, lim)
                       for i, (p, lim) in enumerate([(provider, limiter), *fallbacks])]
        """The ordered providers (``worker.routes``): the primary first, then the fallbacks."""
        names = [route.name for route in self.routes]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"the same provider account twice in the failover list: "
                                     f"{names} (each needs its own account, ceiling and breaker)")
        self.failover = len(self.routes) > 1
        primary = self.routes[0]
        self.traits, self.breaker, self.pacer = primary.traits, primary.breaker, primary.pacer
        self.reconciler = Reconciler(store, self.routes, self.lanes, self._wake_lanes)
        self.heartbeat = Heartbeat(
            store, owner=self.owner,
            provider=", then ".join(_provider_label(r.provider) for r in self.routes),
            lanes={lane.name: lane.share for lane in config.lanes},
            in_flight=lambda: len(self._held), interval_s=config.heartbeat_interval_s,
            clock=clock)
        self.observers.append(self.heartbeat.observe)
        self.caretaker = Caretaker(
            store, controls=self.controls, breakers=[r.breaker for r in self.routes],
            reconciler=self.reconciler, rescue_interval_s=config.rescue_interval_s,
            interval_s=config.controls_interval_s,
            drain=self._drained if config.drain else None, wake=self._wake_lanes, clock=clock,
            housekeeping=Housekeeping(store, self.lanes),
            heartbeat=self.heartbeat,
        )

        # Slot accounting of the lanes (core.lanes.start_capacity reads these).
        self._in_flight: Counter[str] = Counter()
        self._wanting: dict[str, bool] = {name: True for name in self.lanes}
        self._slot_freed = asyncio.Event()
        self._lane_wakeup = {name: asyncio.Event() for name in self.lanes}
        self._send_tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._shutting_down = False

    def _route(self, position: int, provider: Provider,
               limiter: RateLimiter | None) -> ProviderRoute:
        config = self.config
        return ProviderRoute(
            provider, limiter,
            FleetBreaker(self.store, provider.account, self.owner, config.breaker),
            Pacer(limiter, self.lanes, self.counters, horizon_s=config.limiter_horizon_s,
                  late_slot_s=config.late_slot_s, clock=self.clock,
                  yielding=[lane.name for lane in config.lanes if lane.bulk]),
            traits_of(provider), position)

    def _route_named(self, name: str) -> ProviderRoute | None:
        return next((route for route in self.routes if route.name == name), None)

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        """Begin a graceful stop: no new claims; in-flight sends get ``grace_s`` to finish."""
        self._stopping.set()

    async def run(self) -> None:
        for route in self.routes:
            await route.provider.open()
        await self.controls.refresh()
        for route in self.routes:  # an open breaker holds from the first claim on
            await route.breaker.refresh(self.controls.breaker(route.name))
        log.info("worker %s started: lanes %s, concurrency %d, provider %s", self.owner,
                 self.floors, self.config.concurrency,
                 " then ".join(route.provider.name for route in self.routes))
        bulk = [lane.name for lane in self.config.lanes if lane.bulk]
        if bulk and self.config.unsubscribe is None and self.provider.channel == EMAIL:
            log.warning("bulk lane(s) %s send without List-Unsubscribe: set %s and "
                        "--unsubscribe-url (docs/deliverability.md)", ", ".join(bulk),
                        SECRET_ENV)
        try:
            async with asyncio.TaskGroup() as group:
                background = [
                    group.create_task(self._loop("wake-up", self._wake_step), name="waker"),
                    group.create_task(self._loop("ack", self.acker.step), name="acker"),
                    group.create_task(self._loop("lease renewal", self._renew_step),
                                      name="lease-keeper"),
                    group.create_task(self._care(), name="caretaker"),
                ]
                if self.callbacks is not None:
                    background.append(group.create_task(
                        self._loop("callbacks", self.callbacks.step), name="callbacks"))
                lanes = [group.create_task(self._loop(f"lane {name}",
                                                      functools.partial(self._claim_step, name)),
                                           name=f"lane-{name}")
                         for name in self.lanes]
                await self._stopping.wait()
                # In order: no new claims, then in-flight sends finish (or are cancelled after
                # the grace period), then the background loops end between two ack flushes.
                for task in lanes:
                    task.cancel()
                await asyncio.gather(*lanes, return_exceptions=True)
                await self._finish_in_flight()
                self.acker.wake()
                async with self.acker.lock:
                    for task in background:
                        task.cancel()
        except BaseExceptionGroup as failed:  # a loop died of something it could not catch
            raise failed.exceptions[0] from None
        finally:
            self._stopping.set()
            await self._finish_in_flight()
            self.acker.release_unreported()
            await self.acker.flush()
            await self.heartbeat.stop()
            for route in self.routes:
                await route.provider.close()
            if self.callbacks is not None:
                await self.callbacks.close()
            log.info("worker %s stopped: %s", self.owner, dict(self.counters))

    async def _loop(self, where: str, step: Callable[[], Awaitable[bool]]) -> None:
        await supervise(where, step, clock=self.clock, counters=self.counters)

    async def _care(self) -> None:
        await self._loop("caretaker", self.caretaker.step)
        self.stop()  # the caretaker's loop ends only when a drain is complete

    async def _finish_in_flight(self) -> None:
        if self._send_tasks:
            _, pending = await asyncio.wait(set(self._send_tasks), timeout=self.config.grace_s)
            if pending:
                self._shutting_down = True
                log.warning("grace period over: cancelling %d in-flight sends", len(pending))
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    async def _drained(self) -> bool:
        if self._send_tasks or self._held or self.acker.pending:
            return False
        # One statement, one snapshot (a claim between two readings would look like "done").
        # Pending of this worker's channel only: an SMS waiting for an SMS worker is not this
        # one's to send; anything in flight, of any channel, is waited for.
        channels = await self.store.channel_stats()
        return (channels.pending.get(self.provider.channel, 0) == 0
                and sum(channels.sending.values()) == 0)

    def _wake_lanes(self) -> None:
        for event in self._lane_wakeup.values():
            event.set()

    async def _wake_step(self) -> bool:
        try:
            await self.store.wait_for_work(self.config.poll_interval_s)
        finally:  # a failed wait wakes the lanes too: they poll rather than sleep through
            self._wake_lanes()
        return False

    async def _renew_step(self) -> bool:
        """Renew every lease held. A claim not renewed is not counted as lost here: most are
        outcomes the acker wrote meanwhile (a race, not a loss), and a real loss is counted
        once, when the acker finds its outcome's guard no longer holds."""
        await self.clock.sleep(self.config.lease.total_seconds() / 3)
        held = list(self._held.values())
        if held:
            await self.store.renew_leases(self.owner, held, self.config.lease)
        return False

    # -- claiming --------------------------------------------------------------------------
    def _capacity(self, lane: str) -> int:
        """How many more sends ``lane`` may start now (its floor, then borrowed idle slots)."""
        return min(self.config.batch_size,
                   start_capacity(lane, self._in_flight, self.floors, self._wanting))

    async def _claim_step(self, lane: str) -> bool:
        await self._claim_once(lane)
        return self._stopping.is_set()

    async def _claim_once(self, lane: str) -> None:
        """One turn of a lane loop: claim what the lane may send now, and dispatch it."""
        wakeup = self._lane_wakeup[lane]
        if self._stopping.is_set():
            return
        route, probe = await self._may_claim(lane)
        if route is None:
            wakeup.clear()
            await self.clock.wait(wakeup, self.config.controls_interval_s)
            return
        capacity = (max(1, min(self.config.breaker.probes, self._capacity(lane))) if probe
                    else self._capacity(lane))
        if capacity <= 0:
            self._slot_freed.clear()
            await self.clock.wait(self._slot_freed, self.config.poll_interval_s)
            return
        wakeup.clear()
        claiming = asyncio.ensure_future(self.store.claim_batch(
            lane, capacity, self.owner, self.config.lease,
            exclude_imports=self.controls.paused_imports, channel=self.provider.channel,
        ))
        try:
            batch = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            # Stopped mid-claim: the rows may be leased already; hold them so the stop
            # gives them back instead of leaving them leased.
            with contextlib.suppress(Exception):
                for delivery in await claiming:
                    self._held[delivery.id] = Claim(delivery.id, delivery.claims)
            raise
        if probe:
            route.breaker.probe_claimed(batch)
        self._wanting[lane] = len(batch) >= capacity
        if not batch:
            await self.clock.wait(wakeup, self.config.poll_interval_s)
            return
        self.counters["claimed"] += len(batch)
        for observe_claims in self.claim_observers:
            observe_claims(lane, batch)
        self._in_flight[lane] += len(batch)
        for delivery in batch:
            self._held[delivery.id] = Claim(delivery.id, delivery.claims)
        task = asyncio.create_task(self._dispatch(lane, batch, route))
        self._send_tasks.add(task)
        task.add_done_callback(self._send_tasks.discard)

    async def _may_claim(self, lane: str) -> tuple[ProviderRoute | None, bool]:
        """(the provider to claim for, as its breaker's probe); None: claim nothing. Pauses
        and the breakers are fleet-wide; the first provider whose breaker lets it claim wins
        (a probe of the primary comes before a batch for a fallback)."""
        if self.controls.lane_paused(lane):
            return None, False
        for route in self.routes:
            allowed, probe = await route.breaker.may_claim()
            if allowed:
                return route, probe
        return None, False

    # -- sending ---------------------------------------------------------------------------
    async def _dispatch(self, lane: str, batch: list[Delivery], route: ProviderRoute) -> None:
        pending = {d.id: d for d in batch}  # claimed, not yet handed to a send or reported
        try:
            await self._dispatch_batch(lane, batch, pending, route)
        except Exception as exc:
            # The store or the limiter failed between claim and send: nothing was sent, so
            # give the rest back unspent (the ack waits in memory if the store is down).
            self.counters["errors"] += 1
            log.error("dispatch of %d deliveries failed (%s: %s); released unspent",
                      len(pending), type(exc).__name__, exc)
            for delivery in pending.values():
                self._release(delivery, f"not sent: {type(exc).__name__}", delay_s=1.0)

    async def _dispatch_batch(self, lane: str, batch: list[Delivery],
                              pending: dict[int, Delivery], route: ProviderRoute) -> None:
        config = self.lanes[lane]
        now = datetime.now(UTC)
        to_send = []
        for delivery in batch:
            unsendable = (unreadable_decision(delivery)
                          or expire_if_useless(delivery, now, config))
            if unsendable is not None:
                pending.pop(delivery.id)
                self._report(delivery, unsendable, release=True)
                route.breaker.probe_unsent(delivery.id)
            else:
                to_send.append(delivery)
        to_check = [d for d in to_send if d.may_be_suppressed]  # see Delivery's hints
        suppressed = await self.store.suppressed_among(to_check) if to_check else {}
        if suppressed:
            for delivery in [d for d in to_send if d.id in suppressed]:
                # Not a dead letter: the address asked (by bouncing or complaining) for no mail.
                pending.pop(delivery.id)
                self._report(delivery, Decision(
                    State.SUPPRESSED, "suppressed", spend_attempt=False,
                    detail={"why": f"address is suppressed ({suppressed[delivery.id]})"},
                ), release=True)
                route.breaker.probe_unsent(delivery.id)
            to_send = [d for d in to_send if d.id not in suppressed]
        to_send = await self._with_attachments(to_send)
        if not self.failover:
            await self._send_in_groups(lane, config, to_send, pending, route)
            return
        by_route = await self._routed(to_send, pending, route)
        # Every group finishes before a failure is raised: the caller releases what is
        # still pending, and no group may be handing those to sends meanwhile.
        results = await asyncio.gather(
            *(self._send_in_groups(lane, config, group, pending, target, pins)
              for target, (group, pins) in by_route.items()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _routed(
        self, to_send: list[Delivery], pending: dict[int, Delivery], route: ProviderRoute,
    ) -> dict[ProviderRoute, tuple[list[Delivery], set[int]]]:
        """With a fallback: each delivery to the batch's provider, except one pinned to
        another (ambiguous there, settled by its deduplication), which goes there while its
        breaker is closed and otherwise waits for it: never to a third provider."""
        recorded = await self.store.delivery_routes([d.id for d in to_send])
        by_route: dict[ProviderRoute, tuple[list[Delivery], set[int]]] = {}
        for delivery in to_send:
            pin = recorded.get(delivery.id)
            target = route
            if pin is not None and pin.pinned:
                target = self._route_named(pin.provider)  # type: ignore[assignment]
                if target is None or (target is not route and not target.closed):
                    pending.pop(delivery.id)
                    route.breaker.probe_unsent(delivery.id)
                    # Rare (ambiguous at a provider that can only deduplicate): looked at
                    # again every poll interval rather than at the breaker's next probe, so
                    # an operator's reset of that breaker takes effect at once.
                    self._release(delivery, f"pinned to provider {pin.provider}, which is "
                                  "not available here now", delay_s=self.config.poll_interval_s,
                                  event="waiting_for_provider")
                    continue
                if target is not route:
                    route.breaker.probe_unsent(delivery.id)
            group, pins = by_route.setdefault(target, ([], set()))
            group.append(delivery)
            if pin is not None and pin.pinned:
                pins.add(delivery.id)
        return by_route

    async def _with_attachments(self, to_send: list[Delivery]) -> list[Delivery]:
        """The batch with its stored parts, read only now that it is about to be built and
        sent (never by the claim: the side table is keyed by delivery id, one indexed read
        per batch)."""
        with_parts = [d.id for d in to_send if d.has_attachments is not False]
        if not with_parts:
            return to_send
        parts = await self.store.attachments_among(with_parts)
        if not parts:
            return to_send
        return [replace(d, attachments=parts[d.id]) if d.id in parts else d for d in to_send]

    async def _send_in_groups(self, lane: str, config: LaneConfig, to_send: list[Delivery],
                              pending: dict[int, Delivery], route: ProviderRoute,
                              pins: set[int] | None = None) -> None:
        """Reserve slots for as many as the limiter grants, start those attempts, and go on
        reserving while they wait for their slots. Under a backlog the limiter grants a slot
        or two per call (the horizon is full of other batches' slots): waiting for each
        group's sends before reserving the next would send a batch one round trip at a time,
        and a reset released by a 429 would wait seconds behind its own batch."""
        sends: list[asyncio.Task[None]] = []
        try:
            while to_send:
                if self._shutting_down:
                    for delivery in to_send:
                        pending.pop(delivery.id)
                        self._release(delivery, "released at shutdown")
                    break
                reserved = await route.pacer.reserve(lane, len(to_send))
                reserved_at = self.clock.monotonic()
                if reserved is None:  # no slot for long (gate, daily quota): give them back
                    quota_wait = route.pacer.quota_wait_s[lane]  # before another batch resets it
                    retry_in = max(await route.pacer.gate_remaining(), quota_wait)
                    for delivery in to_send:
                        pending.pop(delivery.id)
                        self._release(delivery, "rate limit gate closed or daily quota used",
                                      delay_s=retry_in, event="throttled")
                    break
                delays, uncertainty = reserved
                group, to_send = to_send[:len(delays)], to_send[len(delays):]
                if self.failover:  # written before the request can leave: see worker.routes
                    await self.store.record_routes([
                        Route(d.id, route.name, d.attempts + 1, d.id in (pins or ()))
                        for d in group])
                started = await self.store.start_attempts(
                    self.owner, [Claim(d.id, d.claims) for d in group]
                )
                # Slots are relative to the limiter's decision: the round trip above must not
                # push the whole group late, or it bunches up against the next group's sends.
                elapsed = self.clock.monotonic() - reserved_at
                for delivery, delay in zip(group, delays, strict=True):
                    pending.pop(delivery.id)  # from here on, _send_one owns its outcome
                    if delivery.id not in started:
                        self._lost(delivery, "lease lost before the attempt started")
                        continue
                    sends.append(asyncio.create_task(
                        self._send_one(config, delivery, delay - elapsed, uncertainty, route)))
        except asyncio.CancelledError:  # the grace period is over: so is every send's
            for send in sends:
                send.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
            raise
        except Exception:  # the sends already started own their outcomes: let them finish
            await asyncio.gather(*sends, return_exceptions=True)
            raise
        await asyncio.gather(*sends)

    async def _send_one(self, lane: LaneConfig, delivery: Delivery, delay_s: float,
                        uncertainty_s: float, route: ProviderRoute) -> None:
        try:
            slot = await route.pacer.wait_for_slot(lane.name, delay_s, uncertainty_s)
            quota_wait = route.pacer.quota_wait_s[lane.name]
            gate = 0.0 if slot else max(await route.pacer.gate_remaining(), quota_wait)
        except Exception as exc:  # the limiter is unreachable: the request never left
            self.counters["errors"] += 1
            log.error("delivery %d: no send slot (%s: %s); released unspent", delivery.id,
                      type(exc).__name__, exc, extra=send_extra(delivery))
            self._unsent(route, delivery, f"not sent: {type(exc).__name__}", delay_s=1.0)
            return
        if not slot:
            self._unsent(route, delivery, "rate limit gate closed", event="throttled",
                         delay_s=gate)
            return
        delivery = self._with_unsubscribe(lane, delivery)
        with tracing.sending(delivery) as span:  # a no-op unless traces are on
            await self._attempt(lane, delivery, route, span)

    async def _attempt(self, lane: LaneConfig, delivery: Delivery, route: ProviderRoute,
                       span: Any) -> None:
        """One attempt in its slot, through ``route``: send, decide, report."""
        started = self.clock.monotonic()
        # A hard deadline, the lane's own, classified by the phase the send reached
        # (worker/attempt.py).
        attempt = Attempt(route.provider, delivery,
                          lane.attempt_timeout_s or self.config.attempt_timeout_s,
                          limiter=route.limiter, clock=self.clock)
        try:
            outcome = await attempt.run()
        except asyncio.CancelledError:
            if not self._shutting_down:
                raise
            outcome = attempt.stopped("cancelled at shutdown while in flight")
        except Exception:
            decision = handler_error(delivery, traceback.format_exc())
            decision.detail["duration_ms"] = round((self.clock.monotonic() - started) * 1000, 2)
            decision.detail["provider"] = route.name
            tracing.record_outcome(span, "handler_error", str(decision.state))
            self._report(delivery, decision, release=True)
            route.breaker.probe_unsent(delivery.id)
            return
        if attempt.held_at_gate_s:  # someone's 429 closed the gate since the slot check
            self._unsent(route, delivery, "rate limit gate closed before the request left",
                         event="throttled", delay_s=attempt.held_at_gate_s)
            return
        duration_ms = round((self.clock.monotonic() - started) * 1000, 2)
        decision = decide(delivery, outcome, lane, datetime.now(UTC),
                          traits=deciding_traits(route, self.failover),
                          policy=self.config.retry, rand=self.rand)
        if (outcome.kind is OutcomeClass.ACCOUNT and decision.state is State.PENDING
                and route.position < len(self.routes) - 1):
            # The breaker opens on this answer: the next provider takes it now, not after
            # the account's Retry-After (it certainly did not reach this one).
            decision = dataclasses.replace(decision, delay_s=0.0)
        decision.detail["duration_ms"] = duration_ms
        decision.detail["provider"] = route.name
        self.counters[f"outcome:{outcome.kind}"] += 1
        tracing.record_outcome(span, str(outcome.kind), str(decision.state),
                               outcome.provider_message_id)
        # Reported before any await, so a stop cancelling this task cannot lose the outcome;
        # the slot is freed only once the breaker has seen it.
        self._report(delivery, decision, release=False,
                     provider_message_id=outcome.provider_message_id, error=outcome.response)
        try:
            if outcome.kind is OutcomeClass.THROTTLED and outcome.retry_after_s:
                await route.pacer.close_gate(outcome.retry_after_s)
            await route.breaker.observe(outcome, decision, delivery.id)
        except Exception as exc:  # the outcome is reported; only the fleet signals failed
            self.counters["errors"] += 1
            log.error("delivery %d: could not share its outcome with the fleet (%s: %s)",
                      delivery.id, type(exc).__name__, exc,
                      extra=send_extra(delivery, outcome.provider_message_id))
        finally:
            self._release_slot(delivery)

    def _with_unsubscribe(self, lane: LaneConfig, delivery: Delivery) -> Delivery:
        """The delivery with its one-click unsubscribe headers, on a bulk lane (computed per
        send, never stored: the same bytes every attempt, from the key and the secret)."""
        config = self.config.unsubscribe
        if (config is None or delivery.channel != EMAIL
                or not config.applies(lane.bulk, delivery.template_id)):
            return delivery
        return replace(delivery, unsubscribe=config.for_recipient(
            delivery.recipient, delivery.lane, delivery.id))

    # -- reporting -------------------------------------------------------------------------
    def _report(
        self, delivery: Delivery, decision: Decision, *, release: bool,
        provider_message_id: str | None = None, error: str | None = None,
    ) -> None:
        for observe in self.observers:
            observe(delivery, decision)

        def extra() -> dict[str, object]:  # only for a line that is logged
            return send_extra(delivery, provider_message_id, decision.detail.get("attempt"))

        if decision.state in (State.DEAD, State.EXPIRED):
            reason = decision.dead_reason or str(decision.state)
            self.counters[f"dead:{reason}"] += 1
            level = logging.WARNING if reason == DeadReason.EXPIRED else logging.ERROR
            log.log(level, "ALERT dead letter: delivery %d (%s, lane %s, to %s) reason=%s",
                    delivery.id, delivery.key, delivery.lane,
                    redact_address(delivery.recipient), reason, extra=extra())
        elif decision.state is State.AMBIGUOUS:
            self.counters["ambiguous"] += 1
            log.warning("delivery %d is ambiguous (%s)", delivery.id,
                        decision.detail.get("resolution", ""), extra=extra())
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("delivery %d: %s (lane %s, to %s)", delivery.id, decision.event,
                      delivery.lane, redact_address(delivery.recipient), extra=extra())
        if error is None and decision.state is not State.SENT:
            error = decision.detail.get("why") or decision.detail.get("traceback")
        self.acker.add(Transition(
            id=delivery.id, claims=delivery.claims, state=decision.state, event=decision.event,
            delay_s=decision.delay_s, spend_attempt=decision.spend_attempt, error=error,
            provider_message_id=provider_message_id, dead_reason=decision.dead_reason,
            detail=decision.detail,
        ))
        if release:
            self._release_slot(delivery)

    def _release(self, delivery: Delivery, why: str, *, delay_s: float = 0.0,
                 event: str = "released") -> None:
        """Give a claimed, never-attempted delivery back: no attempt spent."""
        self._report(delivery, Decision(State.PENDING, event, spend_attempt=False,
                                        delay_s=delay_s, detail={"why": why}), release=True)

    def _unsent(self, route: ProviderRoute, delivery: Delivery, why: str, *,
                delay_s: float, event: str = "released") -> None:
        """Release a delivery whose request never left, and let the breaker know: if it was
        the probe, it says nothing about the provider."""
        self._release(delivery, why, delay_s=delay_s, event=event)
        route.breaker.probe_unsent(delivery.id)

    def _lost(self, delivery: Delivery, why: str) -> None:
        self.counters["lease_lost"] += 1
        self._held.pop(delivery.id, None)
        log.warning("delivery %d: %s", delivery.id, why, extra=send_extra(delivery))
        self._release_slot(delivery)

    def _release_slot(self, delivery: Delivery) -> None:
        """Free the send slot; the lease stays held (and renewed) until the ack is written."""
        self._in_flight[delivery.lane] -= 1
        self._slot_freed.set()

    # -- reconciliation --------------------------------------------------------------------
    async def reconcile_ambiguous(self) -> int:
        """Resolve ambiguous deliveries where the provider or the lane allows it."""
        return await self.reconciler.reconcile()
