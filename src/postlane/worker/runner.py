"""The dispatch worker: claims deliveries per lane, sends them within the global limit,
and reports every outcome back to the store, guarded by its lease.

One ``Worker`` runs these asyncio tasks:

- a *lane loop* per lane: claims batches while the lane has slots (its floor, or idle
  slots lent by another lane), then dispatches them;
- the *waker*: waits on the store's enqueue signal (LISTEN/NOTIFY on PostgreSQL) and
  wakes idle lanes;
- the *acker*: writes outcomes in batches, one statement per flush;
- the *lease keeper*: renews the leases of everything held, so slow sends keep their claim;
- the *caretaker*: rescues expired leases, reconciles ambiguous deliveries, reads the
  fleet's controls (pauses, breaker), and in ``drain`` mode notices when all is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from postlane.core.breaker import BreakerConfig
from postlane.core.lanes import DEFAULT_LANES, LaneConfig, check_lanes, may_start, slot_floors
from postlane.core.message import Delivery
from postlane.core.outcomes import OutcomeClass
from postlane.core.policy import (
    Decision,
    ProviderTraits,
    RetryPolicy,
    decide,
    effective_expiry,
    expire_if_useless,
    handler_error,
)
from postlane.core.records import Claim, Transition
from postlane.core.states import DeadReason, State
from postlane.core.validation import redact_address
from postlane.limiter.base import RateLimiter
from postlane.providers.base import Provider
from postlane.store.base import Store
from postlane.worker.attempt import Attempt
from postlane.worker.breaker import FleetBreaker
from postlane.worker.controls import FleetControls
from postlane.worker.poison import unreadable_decision

log = logging.getLogger("postlane.worker")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    concurrency: int = 200
    lanes: tuple[LaneConfig, ...] = DEFAULT_LANES
    batch_size: int = 100
    lease: timedelta = timedelta(seconds=30)
    attempt_timeout_s: float = 10.0
    poll_interval_s: float = 1.0
    grace_s: float = 10.0
    rescue_interval_s: float = 2.0
    controls_interval_s: float = 0.5
    ack_interval_s: float = 0.005
    limiter_horizon_s: float = 0.25
    late_slot_s: float = 0.015
    """A send slot possibly missed by more than this (the event loop stalled, or the limiter's
    answer was slow) is not used late; the send takes a fresh slot. Keep it under the limiter's
    headroom in seconds (2 % = 20 ms): sends spread further from their slots than the headroom
    can overfill a one-second window at the provider."""
    drain: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)


Observer = Callable[[Delivery, Decision], None]
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


def make_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self,
        store: Store,
        provider: Provider,
        *,
        limiter: RateLimiter | None = None,
        config: WorkerConfig = WorkerConfig(),
        rand: Callable[[], float] = random.random,
        owner: str | None = None,
    ) -> None:
        check_lanes(config.lanes)
        self.store = store
        self.provider = provider
        self.limiter = limiter
        self.config = config
        self.rand = rand
        self.owner = owner or make_owner()
        self.lanes = {lane.name: lane for lane in config.lanes}
        self.floors = slot_floors(config.lanes, held_slots(config, limiter))
        caps = provider.capabilities
        self.traits = ProviderTraits(caps.deduplicates_by_key, caps.dedup_window,
                                     caps.can_lookup_by_key)
        self.controls = FleetControls(store)
        self.breaker = FleetBreaker(store, provider.account, self.owner, config.breaker)
        self.counters: Counter[str] = Counter()
        self.observers: list[Observer] = []
        """Called with every decided outcome (metrics hang off this); must not block."""

        self._in_flight: Counter[str] = Counter()
        self._wanting: dict[str, bool] = {name: True for name in self.lanes}
        self._held: dict[int, Claim] = {}
        self._acks: list[Transition] = []
        self._ack_lock = asyncio.Lock()
        self._ack_wakeup = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._lane_wakeup = {name: asyncio.Event() for name in self.lanes}
        # One limiter poller per lane: without it every waiting batch polls the limiter at
        # each freed slot (a thundering herd of round trips per send).
        self._reserve_locks = {name: asyncio.Lock() for name in self.lanes}
        self._gate_check_s = 0.0  # recent worst round trip of a gate check (decaying)
        self._send_tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._shutting_down = False
        self._done = asyncio.Event()
        self._last_rescue = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        """Begin a graceful stop: no new claims; in-flight sends get ``grace_s`` to finish."""
        self._stopping.set()

    async def run(self) -> None:
        await self.provider.open()
        await self.controls.refresh()
        log.info("worker %s started: lanes %s, concurrency %d, provider %s", self.owner,
                 self.floors, self.config.concurrency, self.provider.name)
        background = [
            asyncio.create_task(self._waker(), name="waker"),
            asyncio.create_task(self._acker(), name="acker"),
            asyncio.create_task(self._lease_keeper(), name="lease-keeper"),
            asyncio.create_task(self._caretaker(), name="caretaker"),
        ]
        lanes = [asyncio.create_task(self._lane_loop(name), name=f"lane-{name}")
                 for name in self.lanes]
        try:
            stop = asyncio.create_task(self._stopping.wait())
            done = asyncio.create_task(self._done.wait())
            failed = asyncio.create_task(_first_failure(background + lanes))
            await asyncio.wait({stop, done, failed}, return_when=asyncio.FIRST_COMPLETED)
            for task in (stop, done, failed):
                task.cancel()
            if failed.done() and not failed.cancelled() and failed.exception():
                raise failed.exception()  # type: ignore[misc]
        finally:
            self._stopping.set()
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            await self._finish_in_flight()
            self._ack_wakeup.set()
            async with self._ack_lock:  # never cancel the acker in the middle of a flush
                for task in background:
                    task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._release_unreported()
            await self._flush_acks()
            await self.provider.close()
            log.info("worker %s stopped: %s", self.owner, dict(self.counters))

    def _release_unreported(self) -> None:
        """At the very end of a stop: deliveries still held that no outcome was reported for
        were claimed but never sent (a claim or a slot wait cut short by the stop). Give them
        back unspent rather than leave them leased until the lease expires."""
        reported = {t.id for t in self._acks}
        for claim in list(self._held.values()):
            if claim.id not in reported:
                self._acks.append(Transition(
                    claim.id, claim.claims, State.PENDING, "released", delay_s=0.0,
                    spend_attempt=False, detail={"why": "released at shutdown"}))

    async def _finish_in_flight(self) -> None:
        if self._send_tasks:
            _, pending = await asyncio.wait(set(self._send_tasks), timeout=self.config.grace_s)
            if pending:
                self._shutting_down = True
                log.warning("grace period over: cancelling %d in-flight sends", len(pending))
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    # -- claiming --------------------------------------------------------------------------
    def _capacity(self, lane: str) -> int:
        """How many more sends ``lane`` may start now (its floor, then borrowed idle slots)."""
        in_flight = Counter(self._in_flight)
        count = 0
        while count < self.config.batch_size and may_start(lane, in_flight, self.floors,
                                                           self._wanting):
            in_flight[lane] += 1
            count += 1
        return count

    async def _lane_loop(self, lane: str) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                await self._claim_once(lane)
                failures = 0
            except Exception as exc:  # the database or the limiter is unreachable: back off
                failures += 1
                await self._backoff(f"lane {lane}", exc, failures)

    async def _backoff(self, where: str, exc: Exception, failures: int) -> None:
        """A background loop hit an error it cannot handle (database down, Redis down):
        log it, count it, wait a little longer each time, and carry on."""
        self.counters["errors"] += 1
        delay = min(5.0, 0.1 * 2 ** min(failures, 6))
        log.error("%s: %s: %s; retrying in %.1fs", where, type(exc).__name__, exc, delay)
        await asyncio.sleep(delay)

    async def _claim_once(self, lane: str) -> None:
        """One turn of a lane loop: claim what the lane may send now, and dispatch it."""
        wakeup = self._lane_wakeup[lane]
        if self._stopping.is_set():
            return
        allowed, probe = await self._may_claim(lane)
        if not allowed:
            wakeup.clear()
            await _wait(wakeup, self.config.controls_interval_s)
            return
        capacity = (max(1, min(self.config.breaker.probes, self._capacity(lane))) if probe
                    else self._capacity(lane))
        if capacity <= 0:
            self._slot_freed.clear()
            await _wait(self._slot_freed, self.config.poll_interval_s)
            return
        wakeup.clear()
        claiming = asyncio.ensure_future(self.store.claim_batch(
            lane, capacity, self.owner, self.config.lease,
            exclude_imports=self.controls.paused_imports,
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
            self.breaker.probe_claimed(batch)
        self._wanting[lane] = len(batch) >= capacity
        if not batch:
            await _wait(wakeup, self.config.poll_interval_s)
            return
        self.counters["claimed"] += len(batch)
        self._in_flight[lane] += len(batch)
        for delivery in batch:
            self._held[delivery.id] = Claim(delivery.id, delivery.claims)
        task = asyncio.create_task(self._dispatch(lane, batch))
        self._send_tasks.add(task)
        task.add_done_callback(self._send_tasks.discard)

    async def _may_claim(self, lane: str) -> tuple[bool, bool]:
        """(may claim, as the breaker's probe). Pauses and the breaker are fleet-wide."""
        if self.controls.lane_paused(lane):
            return False, False
        return await self.breaker.may_claim()

    # -- sending ---------------------------------------------------------------------------
    async def _dispatch(self, lane: str, batch: list[Delivery]) -> None:
        pending = {d.id: d for d in batch}  # claimed, not yet handed to a send or reported
        try:
            await self._dispatch_batch(lane, batch, pending)
        except Exception as exc:
            # The store or the limiter failed between claim and send: nothing was sent, so
            # give the rest back unspent (the ack waits in memory if the store is down).
            self.counters["errors"] += 1
            log.error("dispatch of %d deliveries failed (%s: %s); released unspent",
                      len(pending), type(exc).__name__, exc)
            for delivery in pending.values():
                self._release(delivery, f"not sent: {type(exc).__name__}", delay_s=1.0)

    async def _dispatch_batch(self, lane: str, batch: list[Delivery],
                              pending: dict[int, Delivery]) -> None:
        config = self.lanes[lane]
        now = datetime.now(UTC)
        to_send = []
        for delivery in batch:
            unsendable = (unreadable_decision(delivery)
                          or expire_if_useless(delivery, now, config))
            if unsendable is not None:
                pending.pop(delivery.id)
                self._report(delivery, unsendable, release=True)
                self.breaker.probe_unsent(delivery.id)
            else:
                to_send.append(delivery)
        suppressed = await self.store.suppressed_among(to_send)
        if suppressed:
            for delivery in [d for d in to_send if d.id in suppressed]:
                # Not a dead letter: the address asked (by bouncing or complaining) for no mail.
                pending.pop(delivery.id)
                self._report(delivery, Decision(
                    State.SUPPRESSED, "suppressed", spend_attempt=False,
                    detail={"why": f"address is suppressed ({suppressed[delivery.id]})"},
                ), release=True)
                self.breaker.probe_unsent(delivery.id)
            to_send = [d for d in to_send if d.id not in suppressed]
        while to_send:
            if self._shutting_down:
                for delivery in to_send:
                    pending.pop(delivery.id)
                    self._release(delivery, "released at shutdown")
                return
            reserved = await self._reserve_slots(lane, len(to_send))
            reserved_at = time.monotonic()
            if reserved is None:  # the gate is closed for long: give them back, unspent
                retry_in = await self._gate_remaining()
                for delivery in to_send:
                    pending.pop(delivery.id)
                    self._release(delivery, "rate limit gate closed", delay_s=retry_in,
                                  event="throttled")
                return
            delays, uncertainty = reserved
            group, to_send = to_send[:len(delays)], to_send[len(delays):]
            started = await self.store.start_attempts(
                self.owner, [Claim(d.id, d.claims) for d in group]
            )
            # Slots are relative to the limiter's decision: the round trip above must not
            # push the whole group late, or it bunches up against the next group's sends.
            elapsed = time.monotonic() - reserved_at
            sends = []
            for delivery, delay in zip(group, delays, strict=True):
                pending.pop(delivery.id)  # from here on, _send_one owns its outcome
                if delivery.id not in started:
                    self._lost(delivery, "lease lost before the attempt started")
                    continue
                sends.append(self._send_one(config, delivery, delay - elapsed, uncertainty))
            await asyncio.gather(*sends)

    async def _reserve_slots(self, lane: str, n: int) -> tuple[list[float], float] | None:
        """Send slots for up to ``n`` deliveries as (delays from now, uncertainty); None when
        the gate stays shut for long. The limiter decided somewhere within the round trip, so a
        slot counted from its answer may be late by up to that round trip: the uncertainty."""
        if self.limiter is None:
            return [0.0] * n, 0.0
        async with self._reserve_locks[lane]:
            while True:
                asked = time.monotonic()
                reservation = await self.limiter.reserve(n, self.config.limiter_horizon_s)
                if reservation.delays_s:
                    return reservation.delays_s, time.monotonic() - asked
                if reservation.retry_in_s > 2.0:
                    return None
                self.counters["limiter_waits"] += 1
                await asyncio.sleep(reservation.retry_in_s)

    async def _gate_remaining(self) -> float:
        return await self.limiter.gate_remaining_s() if self.limiter else 0.0

    async def _wait_for_slot(self, lane: str, delay_s: float, uncertainty_s: float) -> bool:
        """Sleep until the reserved slot; False when the gate is closed (someone's 429).

        A slot possibly missed by more than ``late_slot_s`` is not used: after an event-loop
        stall (or a slow limiter answer, or a slow gate check), every send whose slot passed
        meanwhile would go out at once, on top of the on-time sends of other tasks and
        processes, and overfill the provider's one-second window. Such a send takes a fresh
        slot instead. The gate is checked ahead of the slot by the recent worst round trip of
        that check (decaying, capped at ``late_slot_s``), so the check does not make the send
        late, and before that test, so a slower check still counts.
        """
        deadline = time.monotonic() + delay_s
        while True:
            early = deadline - self._gate_check_s
            if early > time.monotonic():
                await asyncio.sleep(early - time.monotonic())
            # A slot granted before someone's 429 closed the gate is not used while it is shut.
            asked = time.monotonic()
            closed = await self._gate_remaining()
            self._gate_check_s = min(max(time.monotonic() - asked, self._gate_check_s * 0.95),
                                     self.config.late_slot_s)
            if closed:
                return False
            if deadline > time.monotonic():
                await asyncio.sleep(deadline - time.monotonic())
            late = time.monotonic() - deadline + uncertainty_s
            if self.limiter is None or late <= self.config.late_slot_s:
                return True
            self.counters["late_slots"] += 1
            reserved = await self._reserve_slots(lane, 1)
            if reserved is None:
                return False
            (delay_s,), uncertainty_s = reserved
            deadline = time.monotonic() + delay_s

    async def _send_one(self, lane: LaneConfig, delivery: Delivery, delay_s: float,
                        uncertainty_s: float = 0.0) -> None:
        try:
            slot = await self._wait_for_slot(lane.name, delay_s, uncertainty_s)
            gate = 0.0 if slot else await self._gate_remaining()
        except Exception as exc:  # the limiter is unreachable: the request never left
            self.counters["errors"] += 1
            log.error("delivery %d: no send slot (%s: %s); released unspent", delivery.id,
                      type(exc).__name__, exc)
            self._release(delivery, f"not sent: {type(exc).__name__}", delay_s=1.0)
            return
        if not slot:
            self._release(delivery, "rate limit gate closed", event="throttled", delay_s=gate)
            return
        started = time.perf_counter()
        # A hard deadline, classified by the phase the send reached (worker/attempt.py).
        attempt = Attempt(self.provider, delivery, self.config.attempt_timeout_s,
                          limiter=self.limiter)
        try:
            outcome = await attempt.run()
        except asyncio.CancelledError:
            if not self._shutting_down:
                raise
            outcome = attempt.stopped("cancelled at shutdown while in flight")
        except Exception:
            decision = handler_error(delivery, traceback.format_exc())
            decision.detail["duration_ms"] = round((time.perf_counter() - started) * 1000, 2)
            self._report(delivery, decision, release=True)
            self.breaker.probe_unsent(delivery.id)
            return
        duration_ms = round((time.perf_counter() - started) * 1000, 2)
        decision = decide(delivery, outcome, lane, datetime.now(UTC), traits=self.traits,
                          policy=self.config.retry, rand=self.rand)
        decision.detail["duration_ms"] = duration_ms
        self.counters[f"outcome:{outcome.kind}"] += 1
        # Reported before any await, so a stop cancelling this task cannot lose the outcome;
        # the slot is freed only once the breaker has seen it.
        self._report(delivery, decision, release=False,
                     provider_message_id=outcome.provider_message_id, error=outcome.response)
        try:
            if outcome.kind is OutcomeClass.THROTTLED and outcome.retry_after_s and self.limiter:
                await self.limiter.close_gate(outcome.retry_after_s)
            await self.breaker.observe(outcome, decision, delivery.id)
        except Exception as exc:  # the outcome is reported; only the fleet signals failed
            self.counters["errors"] += 1
            log.error("delivery %d: could not share its outcome with the fleet (%s: %s)",
                      delivery.id, type(exc).__name__, exc)
        finally:
            self._release_slot(delivery)

    # -- reporting -------------------------------------------------------------------------
    def _report(
        self, delivery: Delivery, decision: Decision, *, release: bool,
        provider_message_id: str | None = None, error: str | None = None,
    ) -> None:
        for observe in self.observers:
            observe(delivery, decision)
        if decision.state in (State.DEAD, State.EXPIRED):
            reason = decision.dead_reason or str(decision.state)
            self.counters[f"dead:{reason}"] += 1
            level = logging.WARNING if reason == DeadReason.EXPIRED else logging.ERROR
            log.log(level, "ALERT dead letter: delivery %d (%s, lane %s, to %s) reason=%s",
                    delivery.id, delivery.key, delivery.lane,
                    redact_address(delivery.recipient), reason)
        elif decision.state is State.AMBIGUOUS:
            self.counters["ambiguous"] += 1
            log.warning("delivery %d is ambiguous (%s)", delivery.id,
                        decision.detail.get("resolution", ""))
        if error is None and decision.state is not State.SENT:
            error = decision.detail.get("why") or decision.detail.get("traceback")
        self._acks.append(Transition(
            id=delivery.id, claims=delivery.claims, state=decision.state, event=decision.event,
            delay_s=decision.delay_s, spend_attempt=decision.spend_attempt, error=error,
            provider_message_id=provider_message_id, dead_reason=decision.dead_reason,
            detail=decision.detail,
        ))
        if len(self._acks) >= self.config.batch_size:
            self._ack_wakeup.set()
        if release:
            self._release_slot(delivery)

    def _release(self, delivery: Delivery, why: str, *, delay_s: float = 0.0,
                 event: str = "released") -> None:
        """Give a claimed, never-attempted delivery back: no attempt spent."""
        self._report(delivery, Decision(State.PENDING, event, spend_attempt=False,
                                        delay_s=delay_s, detail={"why": why}), release=True)

    def _lost(self, delivery: Delivery, why: str) -> None:
        self.counters["lease_lost"] += 1
        self._held.pop(delivery.id, None)
        log.warning("delivery %d: %s", delivery.id, why)
        self._release_slot(delivery)

    def _release_slot(self, delivery: Delivery) -> None:
        """Free the send slot; the lease stays held (and renewed) until the ack is written."""
        self._in_flight[delivery.lane] -= 1
        self._slot_freed.set()

    async def _acker(self) -> None:
        failures = 0
        while True:
            await _wait(self._ack_wakeup, self.config.ack_interval_s)
            self._ack_wakeup.clear()
            try:
                await self._flush_acks()
                failures = 0
            except Exception as exc:  # kept in memory and written once the store is back
                failures += 1
                await self._backoff("ack", exc, failures)

    async def _flush_acks(self) -> None:
        async with self._ack_lock:
            if not self._acks:
                return
            batch, self._acks = self._acks, []
            try:
                applied = await self.store.set_state_if_sending_many(self.owner, batch)
            except BaseException:
                self._acks[:0] = batch
                raise
            for transition in batch:
                self._held.pop(transition.id, None)
                if transition.id not in applied:
                    self.counters["lease_lost"] += 1
                    log.warning("delivery %d: outcome %s dropped, the lease was taken over",
                                transition.id, transition.event)
                else:
                    self.counters[f"state:{transition.state}"] += 1

    # -- background ------------------------------------------------------------------------
    async def _waker(self) -> None:
        failures = 0
        while True:
            try:
                await self.store.wait_for_work(self.config.poll_interval_s)
                failures = 0
            except Exception as exc:
                failures += 1
                await self._backoff("wake-up", exc, failures)
            for event in self._lane_wakeup.values():
                event.set()

    async def _lease_keeper(self) -> None:
        interval = self.config.lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            held = list(self._held.values())
            if held:
                try:
                    kept = await self.store.renew_leases(self.owner, held, self.config.lease)
                except Exception as exc:
                    self.counters["errors"] += 1
                    log.error("lease renewal failed (%s: %s)", type(exc).__name__, exc)
                    continue
                lost = len(held) - len(kept)
                if lost:
                    self.counters["lease_lost"] += lost

    async def _caretaker(self) -> None:
        failures = 0
        while True:
            try:
                if await self._care():
                    return
                failures = 0
            except Exception as exc:
                failures += 1
                await self._backoff("caretaker", exc, failures)
                continue
            await asyncio.sleep(self.config.controls_interval_s)

    async def _care(self) -> bool:
        """One round of housekeeping; True when a drain is complete."""
        await self.controls.refresh()
        await self.breaker.refresh(self.controls.breaker(self.provider.account))
        if time.monotonic() - self._last_rescue >= self.config.rescue_interval_s:
            self._last_rescue = time.monotonic()
            rescued = await self.store.rescue_expired_leases()
            if rescued.requeued or rescued.ambiguous:
                log.warning("rescued expired leases: %d requeued, %d ambiguous",
                            len(rescued.requeued), len(rescued.ambiguous))
                for event in self._lane_wakeup.values():
                    event.set()
            await self.reconcile_ambiguous()
        if self.config.drain and await self._drained():
            self._done.set()
            return True
        return False

    async def _drained(self) -> bool:
        if self._send_tasks or self._held or self._acks:
            return False
        states = (await self.store.stats()).states
        return states.get("pending", 0) == 0 and states.get("sending", 0) == 0

    async def reconcile_ambiguous(self) -> int:
        """Resolve ambiguous deliveries where the provider or the lane allows it."""
        lanes = [name for name, lane in self.lanes.items()
                 if self.traits.deduplicates_by_key or self.traits.can_lookup_by_key
                 or lane.on_ambiguous == "resend"]
        if not lanes:
            return 0
        resolved = []
        now = datetime.now(UTC)
        for delivery in await self.store.list_ambiguous(100, lanes=lanes):
            lane = self.lanes.get(delivery.lane)
            if lane is None:
                continue
            transition = await self._resolution(delivery, lane, now)
            if transition is not None:
                resolved.append(transition)
        applied = await self.store.set_state_if_ambiguous_many(resolved)
        if applied:
            log.info("reconciled %d ambiguous deliveries", len(applied))
            for event in self._lane_wakeup.values():
                event.set()
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


async def _wait(event: asyncio.Event, timeout: float) -> None:
    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


async def _first_failure(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Return when any task fails (re-raising its error); tasks are not meant to end."""
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    await asyncio.Event().wait()
