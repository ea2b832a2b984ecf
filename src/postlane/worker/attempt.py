"""One send attempt under a hard deadline, classified by how far it got.

``provider.send`` runs as a task of its own with an ``AttemptProgress`` bound to it. The
worker waits for that task's end on its ``Clock`` (not with ``asyncio.timeout`` around the
send: on Python 3.11 a library's internal ``wait_for`` can swallow the cancellation, and the
send would then hold its slot until the library's own timeout; and a test clock moves the
deadline without real waiting). The deadline is armed once the send first waits, and not at
all for a send that is done by then (one that needs no I/O): on Python 3.12 and later the
task starts eagerly, running to its first wait inside the call that creates it; on 3.11 it
gets one turn of the loop. At the deadline:

1. ``progress.abandon()`` reads the phase reached and closes the gate, so the send can no
   longer pass its point of no return (``reach`` raises from then on);
2. the task is cancelled, and waited for at most ``CANCEL_GRACE_S`` so that a well-behaved
   adapter closes its connection before the slot is reused;
3. the attempt is classified by that phase: before the point of no return it is
   *transient* (the provider cannot have the message; retried with backoff, never held),
   past it *ambiguous*. An adapter that reports no phase counts as past it.

A reply that arrives after the deadline -- during the grace or later -- is ignored: the
outcome is the deadline's classification, and a task that outlives the grace finishes in
the background with its result discarded.

A 429 with Retry-After closes the limiter's shared gate inside the send task, in the same
step as the answer: the worker sees the outcome a loop iteration or two later, and any
send of this process whose gate check fell in between would leave after the 429. For the
same reason the send task reads the gate as this process knows it (``gate_seen_s``, no
round trip, no await before the provider is called) as its last step before the request: a
send whose slot check passed just before another send's 429 is held back, unspent
(``held_at_gate_s``), instead of leaving after it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from contextvars import Context
from typing import Any

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass, Phase
from postlane.limiter.base import RateLimiter
from postlane.providers.base import Provider
from postlane.providers.progress import AttemptProgress, tracked_context
from postlane.worker.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("postlane.worker")

CANCEL_GRACE_S = 0.05
"""How long a cancelled send may take to clean up before the worker stops waiting for it."""

_abandoned: set[asyncio.Task[Outcome]] = set()
"""Sends that outlived their deadline and grace: referenced until they end on their own."""


class Attempt:
    """Sends one delivery and knows, whatever happens, how far the send got."""

    def __init__(self, provider: Provider, delivery: Delivery, timeout_s: float, *,
                 limiter: RateLimiter | None = None,
                 cancel_grace_s: float = CANCEL_GRACE_S, clock: Clock = SYSTEM_CLOCK) -> None:
        self.provider = provider
        self.delivery = delivery
        self.timeout_s = timeout_s
        self.limiter = limiter
        self.cancel_grace_s = cancel_grace_s
        self.clock = clock
        self.progress = AttemptProgress()
        self.held_at_gate_s = 0.0
        """How long the gate stays shut, when the send was held back before the request; the
        caller releases the delivery unspent for that long."""

    async def run(self) -> Outcome:
        """The outcome within the deadline, or the deadline's classification. An exception
        out of the adapter (a bug) propagates; a cancellation of the caller cancels the send
        and propagates too (``stopped`` classifies it)."""
        task = _started(self._send(), tracked_context(self.progress))
        ended: asyncio.Event | None = None
        try:
            # A send that needs no I/O (no-op, in-process) is done before its deadline is
            # armed, which would cost more than the send did: at once where the task
            # started eagerly, else after one turn of the loop. The race a 429 could win in
            # that turn is closed inside the send task itself (``gate_seen_s`` is its last
            # step before the request).
            if not task.done() and not EAGER_TASKS:
                await asyncio.sleep(0)
            if not task.done():
                ended = _ended_event(task)
                await self.clock.wait(ended, self.timeout_s)
        except asyncio.CancelledError:
            self.progress.abandon()
            _let_go(task)
            raise
        if task.done():
            return task.result().at(self.progress.phase)
        phase = self.progress.abandon()
        task.cancel()
        assert ended is not None  # the task was not done after the first turn
        await self.clock.wait(ended, self.cancel_grace_s)
        if not task.done():
            log.warning("delivery %d: the send ignored its cancellation at the deadline; "
                        "left to end in the background", self.delivery.id)
        _let_go(task)
        waited = f"no answer within {self.timeout_s:g}s"
        return at_deadline(phase, waited, if_sent=f"{waited} after the request left")

    async def _send(self) -> Outcome:
        if self.limiter is not None and (shut_s := self.limiter.gate_seen_s()) > 0:
            self.held_at_gate_s = shut_s
            return Outcome.throttled(shut_s, "not sent: the rate-limit gate closed before the "
                                     "request left")
        outcome = await self.provider.send(self.delivery)
        if (outcome.kind is OutcomeClass.THROTTLED and outcome.retry_after_s
                and self.limiter is not None):
            try:
                await self.limiter.close_gate(outcome.retry_after_s)
            except Exception as exc:  # the worker closes it again when it reports
                log.error("delivery %d: could not close the rate-limit gate (%s: %s)",
                          self.delivery.id, type(exc).__name__, exc)
        return outcome

    def stopped(self, why: str) -> Outcome:
        """The outcome of an attempt cancelled from outside (the worker shutting down)."""
        return at_deadline(self.progress.abandon(), why, if_sent=why)


def at_deadline(phase: Phase | None, why: str, *, if_sent: str) -> Outcome:
    """An attempt cut off in ``phase``: transient before the point of no return, else
    ambiguous with the text ``if_sent`` (also when the adapter reported no phase: nothing
    proves the request did not leave)."""
    if phase is None or phase.may_have_reached_provider:
        return Outcome.ambiguous(if_sent, phase=phase)
    return Outcome.transient(f"not sent: {why} (in phase {phase}, before the point of no "
                             "return)", phase=phase)


EAGER_TASKS = sys.version_info >= (3, 12)
"""Python 3.12 can start a task eagerly: it runs to its first suspension inside the call
that creates it, and one that never suspends is done without a turn of the loop."""


def _started(send: Coroutine[Any, Any, Outcome], context: Context) -> asyncio.Task[Outcome]:
    """``send`` as a task of its own, in ``context``, started at once where Python can."""
    if EAGER_TASKS:
        return asyncio.Task(send, loop=asyncio.get_running_loop(), context=context,
                            eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return asyncio.get_running_loop().create_task(send, context=context)


def _ended_event(task: asyncio.Task[Outcome]) -> asyncio.Event:
    """An event set when ``task`` ends (the clock waits on events)."""
    ended = asyncio.Event()
    task.add_done_callback(lambda _: ended.set())
    return ended


def _let_go(task: asyncio.Task[Outcome]) -> None:
    """Stop caring about ``task`` without leaking it or its exception."""
    task.cancel()
    if task.done():
        _consume(task)
        return
    _abandoned.add(task)
    task.add_done_callback(_consume)


def _consume(task: asyncio.Task[Outcome]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
