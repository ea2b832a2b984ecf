"""Prometheus metrics: the four numbers, from the store at scrape time and from the worker.

Two exporters, one naming scheme (``postlane_*``), each with its own ``CollectorRegistry``
(nothing is registered on the process-global default registry):

**The fleet's state** (``StoreCollector``; ``postlane serve`` serves it at ``/metrics``).
Gauges computed at scrape time from ``FleetStore.stats()`` and ``FleetStore.get_controls()``:

=========================================  ===================================================
``postlane_queue_depth{lane}``             pending + sending deliveries
``postlane_queue_oldest_age_seconds``      age since enqueue of the oldest of those, per lane
``postlane_queue_by_attempt{attempt}``     active deliveries by the attempt they are on ("1":
                                           a first try); a growing tail means trouble
``postlane_deliveries{state}``             every delivery kept (until pruned), by state
``postlane_dead_letters_open{reason}``     dead letters not replayed, sent or discarded
``postlane_dead_letters_open_by_cause``    the same, by cause (``core.causes``)
``postlane_enqueued_total{lane}``          deliveries ever enqueued (kept + pruned)
``postlane_lane_paused{lane}``             1 while an operator pause is in force
``postlane_import_paused{import_id}``      1 while an import is paused
``postlane_breaker_state{account,state}``  1 while a provider account's breaker is open or
                                           half-open (absent: closed)
``postlane_status_query_seconds``          how long the scrape's store queries took
``postlane_provider_events_total``         provider events kept (webhooks, DSNs, one-click
``{kind,lane}``                            unsubscribes) by normalised kind and lane ('' when
                                           the event matched no delivery): bounce and
                                           complaint rates are ``rate()`` of these over
                                           ``postlane_sends_total``
=========================================  ===================================================

Cost per scrape: eight queries (two read the provider events: the last day's per lane over
their ``received_at`` index, and the totals as a ``GROUP BY`` bounded by retention).
Depth/oldest age and the attempt distribution read only
active rows (``state IN ('pending', 'sending')``, served by the partial indexes on pending
and leased rows); open dead letters use the partial index on open entries; the controls
table holds a handful of rows. The count by state is a ``GROUP BY`` over every row kept,
bounded by retention (``postlane prune``): with millions of finished rows, scrape every
30 s rather than every 5 s. A snapshot younger than a second is reused (``FleetSampler``),
so several scrapers and open dashboards do not multiply the queries.

**The worker's outcomes** (``WorkerMetrics``; exported by the worker process itself):

==================================================  ==========================================
``postlane_sends_total{lane,outcome}``              attempts by outcome class (accepted,
                                                    throttled, transient, ambiguous,
                                                    permanent, account, handler_error)
``postlane_dead_letter_arrivals_total{lane,reason,cause}``  dead-lettered by this worker
``postlane_claim_age_seconds{lane}``                how long a delivery was due when claimed
``postlane_limiter_errors_total``                   failed rate-limiter calls (Redis down)
``postlane_send_duration_seconds{lane}``            the provider call, per attempt
``postlane_enqueue_to_send_seconds{lane}``          enqueue until accepted (a replay counts
                                                    from the original enqueue)
``postlane_limiter_waits_total``                    waits for a rate-limiter slot
``postlane_worker_late_slots_total``                slots missed after an event-loop stall
``postlane_worker_lease_lost_total``                outcomes dropped: the lease was taken
``postlane_worker_claimed_total``                   deliveries claimed
==================================================  ==========================================

How ``postlane worker`` uses it (its owner wires a ``--metrics-port`` option)::

    instance = Worker(store, provider, limiter=limiter, config=config)
    if metrics_port:
        WorkerMetrics(instance).serve(metrics_port, addr=metrics_addr)  # daemon thread
    await instance.run()

Dead letters made by the reconciler (``ambiguous_unresolved``) do not pass through
``Worker.observers`` and are not counted in ``postlane_dead_letter_arrivals_total``; they
show in ``postlane_dead_letters_open``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from postlane.core.causes import CAUSES_BY_REASON, DeadCause, cause_of
from postlane.core.message import Delivery
from postlane.core.outcomes import OutcomeClass
from postlane.core.states import DeadReason, State
from postlane.status import FleetStatus, fleet_status
from postlane.store.roles import FleetStore

if TYPE_CHECKING:
    from postlane.core.policy import Decision
    from postlane.worker.runner import Worker

__all__ = [
    "CONTENT_TYPE",
    "FleetSampler",
    "FleetStatus",
    "StoreCollector",
    "WorkerMetrics",
    "fleet_status",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

SEND_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CLAIM_AGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                     3600.0)
ENQUEUE_TO_SEND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                           900.0, 3600.0)


# -- the fleet's state, as ``postlane status`` shows it ----------------------------------
class FleetSampler:
    """Readings of the store kept in memory: the latest one (shared by the metrics scrape
    and the dashboard) and, per lane, depth and oldest age over the last ``window_s``."""

    def __init__(self, store: FleetStore, *, interval_s: float = 5.0, window_s: float = 3600.0,
                 max_age_s: float = 1.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self.window_s = window_s
        self.max_age_s = max_age_s
        self.latest: FleetStatus | None = None
        self.history: list[tuple[float, dict[str, tuple[int, float]]]] = []
        """(unix time, {lane: (depth, oldest age)}), oldest first."""
        self._lock = asyncio.Lock()

    async def current(self, max_age_s: float | None = None) -> FleetStatus:
        """The latest reading if it is younger than ``max_age_s``, else a new one."""
        limit = self.max_age_s if max_age_s is None else max_age_s
        async with self._lock:
            latest = self.latest
            if latest is None or time.time() - latest.taken_at > limit:
                latest = await fleet_status(self.store)
                self._record(latest)
            return latest

    def _record(self, status: FleetStatus) -> None:
        self.latest = status
        lanes = {name: (lane.depth, lane.oldest_age_s)
                 for name, lane in status.stats.lanes.items()}
        if self.history and status.taken_at - self.history[-1][0] < self.interval_s / 2:
            self.history[-1] = (status.taken_at, lanes)  # keep samples about evenly spaced
        else:
            self.history.append((status.taken_at, lanes))
        horizon = status.taken_at - self.window_s
        while self.history and self.history[0][0] < horizon:
            self.history.pop(0)

    def series(self, lane: str) -> list[tuple[float, int, float]]:
        """(unix time, depth, oldest age) of ``lane`` over the window, oldest first."""
        return [(at, *lanes[lane]) for at, lanes in self.history if lane in lanes]

    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled; a failed reading is skipped."""
        while True:
            # A failed reading leaves a gap in the charts; the next one may work.
            with contextlib.suppress(Exception):
                await self.current(max_age_s=self.interval_s / 2)
            await asyncio.sleep(self.interval_s)


# -- the fleet's state as Prometheus gauges ----------------------------------------------
class StoreCollector(Collector):
    """Gauges from the latest ``FleetStatus``; ``render`` takes the reading first."""

    def __init__(self, sampler: FleetSampler) -> None:
        self.sampler = sampler
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._status: FleetStatus | None = None

    async def render(self) -> bytes:
        """The exposition text for one scrape (one reading of the store, or a recent one)."""
        self._status = await self.sampler.current()
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        status = self._status
        if status is None:
            return
        yield from store_metrics(status)


def store_metrics(status: FleetStatus) -> Iterator[Metric]:
    stats = status.stats
    depth = GaugeMetricFamily("postlane_queue_depth",
                              "Deliveries not yet done (pending + sending), per lane.",
                              labels=["lane"])
    oldest = GaugeMetricFamily("postlane_queue_oldest_age_seconds",
                               "Age since enqueue of the oldest not-yet-done delivery, per "
                               "lane (0 when there is none).", labels=["lane"])
    for name, lane in sorted(stats.lanes.items()):
        depth.add_metric([name], lane.depth)
        oldest.add_metric([name], lane.oldest_age_s)
    yield depth
    yield oldest

    attempts = GaugeMetricFamily("postlane_queue_by_attempt",
                                 "Active (pending or sending) deliveries by the attempt they "
                                 "are on; 1 is a first try.", labels=["attempt"])
    for attempt, count in sorted(stats.attempts.items(), key=lambda kv: int(kv[0])):
        attempts.add_metric([attempt], count)
    yield attempts

    states = GaugeMetricFamily("postlane_deliveries",
                               "Deliveries kept (until pruned), by state.", labels=["state"])
    for state, count in sorted(stats.states.items()):
        states.add_metric([state], count)
    yield states

    dead = GaugeMetricFamily("postlane_dead_letters_open",
                             "Open dead letters (not replayed and sent, not discarded), by "
                             "reason.", labels=["reason"])
    for reason in sorted({*map(str, DeadReason), *stats.dead_letters}):
        dead.add_metric([reason], stats.dead_letters.get(reason, 0))
    yield dead

    causes = GaugeMetricFamily("postlane_dead_letters_open_by_cause",
                               "Open dead letters by cause (what to fix; see "
                               "postlane.core.causes).", labels=["cause"])
    for cause in sorted({*map(str, DeadCause), *stats.dead_letter_causes}):
        causes.add_metric([cause], stats.dead_letter_causes.get(cause, 0))
    yield causes

    enqueued = CounterMetricFamily("postlane_enqueued",
                                   "Deliveries ever enqueued (kept + pruned), per lane: its "
                                   "rate is the arrival rate.", labels=["lane"])
    for lane_name, count in sorted(stats.arrivals.items()):
        enqueued.add_metric([lane_name], count)
    yield enqueued

    paused = GaugeMetricFamily("postlane_lane_paused",
                               "1 while an operator pause stops claims of the lane.",
                               labels=["lane"])
    paused_lanes = set(status.paused_lanes)
    for lane_name in sorted(set(stats.lanes) | paused_lanes):
        paused.add_metric([lane_name], 1 if lane_name in paused_lanes else 0)
    yield paused

    imports = GaugeMetricFamily("postlane_import_paused", "1 while an import is paused.",
                                labels=["import_id"])
    for import_id in status.paused_imports:
        imports.add_metric([import_id], 1)
    yield imports

    breaker = GaugeMetricFamily("postlane_breaker_state",
                                "1 while a provider account's circuit breaker is open or "
                                "half-open (no series: closed).", labels=["account", "state"])
    for account, record in sorted(status.breakers.items()):
        breaker.add_metric([account, str(record.get("state", "open"))], 1)
    yield breaker

    events = CounterMetricFamily("postlane_provider_events",
                                 "Provider events kept (delivered, bounced, soft_bounced, "
                                 "complained, rejected, unsubscribed...), by kind and lane.",
                                 labels=["kind", "lane"])
    for (kind, lane_name), count in sorted(status.provider_events.items()):
        events.add_metric([kind, lane_name], count)
    yield events

    took = GaugeMetricFamily("postlane_status_query_seconds",
                             "Time the store queries behind these gauges took.")
    took.add_metric([], status.query_s)
    yield took


# -- the worker's outcomes ---------------------------------------------------------------
class WorkerMetrics:
    """Counters and histograms fed by ``Worker.observers``, plus the worker's own counters
    (limiter waits, late slots, lost leases, claims) read at scrape time."""

    OUTCOMES = (*map(str, OutcomeClass), "handler_error")

    def __init__(self, worker: Worker, registry: CollectorRegistry | None = None) -> None:
        self.worker = worker
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.sends = Counter("postlane_sends_total",
                             "Send attempts by outcome class, per lane and provider (the "
                             "account: a worker with a fallback has several).",
                             ["lane", "outcome", "provider"], registry=self.registry)
        self.dead = Counter("postlane_dead_letter_arrivals_total",
                            "Deliveries dead-lettered by this worker, by reason and cause, per "
                            "lane and provider of the last attempt ('' when none was made).",
                            ["lane", "reason", "cause", "provider"], registry=self.registry)
        self.claim_age = Histogram("postlane_claim_age_seconds",
                                   "How long a delivery was ready (due) before a worker "
                                   "claimed it, per lane.", ["lane"],
                                   buckets=CLAIM_AGE_BUCKETS, registry=self.registry)
        self.send_seconds = Histogram("postlane_send_duration_seconds",
                                      "Duration of the provider call, per lane.", ["lane"],
                                      buckets=SEND_DURATION_BUCKETS, registry=self.registry)
        self.latency = Histogram("postlane_enqueue_to_send_seconds",
                                 "Time from enqueue until the provider accepted, per lane.",
                                 ["lane"], buckets=ENQUEUE_TO_SEND_BUCKETS,
                                 registry=self.registry)
        self.registry.register(_WorkerCounters(worker))
        # Every series exists from the start at 0, so that the first arrival is an increase.
        providers = [route.name for route in worker.routes]
        for lane in worker.lanes:
            for provider in providers:
                for outcome in self.OUTCOMES:
                    self.sends.labels(lane, outcome, provider)
                for reason, reason_causes in CAUSES_BY_REASON.items():
                    for cause in reason_causes:
                        self.dead.labels(lane, str(reason), str(cause), provider)
            self.send_seconds.labels(lane)
            self.latency.labels(lane)
            self.claim_age.labels(lane)
        worker.observers.append(self.observe)
        worker.claim_observers.append(self.observe_claims)

    def observe_claims(self, lane: str, batch: Sequence[Delivery]) -> None:
        """A ``Worker`` claim observer: how long each claimed delivery had been due."""
        now = datetime.now(UTC)
        for delivery in batch:
            waited = (now - delivery.run_at).total_seconds()
            self.claim_age.labels(lane).observe(max(0.0, waited))

    def observe(self, delivery: Delivery, decision: Decision) -> None:
        """A ``Worker`` observer: called with every decided outcome; never blocks."""
        lane = delivery.lane
        outcome = decision.detail.get("outcome")
        provider = str(decision.detail.get("provider", ""))
        if outcome is not None:
            self.sends.labels(lane, str(outcome), provider).inc()
            duration_ms = decision.detail.get("duration_ms")
            if isinstance(duration_ms, int | float):
                self.send_seconds.labels(lane).observe(duration_ms / 1000.0)
        if decision.state in (State.DEAD, State.EXPIRED):
            reason = decision.dead_reason or str(decision.state)
            named = decision.detail.get("cause")
            cause = cause_of(reason, decision.detail.get("response"),
                             named if isinstance(named, str) else None)
            self.dead.labels(lane, str(reason), str(cause), provider).inc()
        elif decision.state is State.SENT:
            waited = (datetime.now(UTC) - delivery.created_at).total_seconds()
            self.latency.labels(lane).observe(max(0.0, waited))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns the server
        (``server.shutdown()`` stops it). Port 0 picks a free one (``server.server_port``)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server


class _WorkerCounters(Collector):
    """The worker's own ``counters`` as Prometheus counters, read at scrape time."""

    COUNTERS = (
        ("postlane_limiter_waits", "limiter_waits",
         "Times a send waited for a rate-limiter slot."),
        ("postlane_worker_late_slots", "late_slots",
         "Send slots missed after an event-loop stall (the send took a fresh slot)."),
        ("postlane_worker_lease_lost", "lease_lost",
         "Outcomes dropped because the lease had been taken over."),
        ("postlane_worker_claimed", "claimed", "Deliveries claimed."),
        ("postlane_limiter_errors", "limiter_errors",
         "Rate-limiter calls that failed (Redis down or unreachable): nothing is sent "
         "while they fail."),
    )

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        counters = self.worker.counters
        for name, key, help_text in self.COUNTERS:
            family = CounterMetricFamily(name, help_text)
            family.add_metric([], float(counters.get(key, 0)))
            yield family
        sender = self.worker.callbacks
        if sender is not None:
            family = CounterMetricFamily(
                "postlane_callbacks", "Status callback attempts by outcome: sent, retry (the "
                "receiver failed or timed out), dead (its budget spent).", labels=["outcome"])
            for outcome in ("sent", "retry", "dead"):
                family.add_metric([outcome], float(sender.counters.get(outcome, 0)))
            yield family
