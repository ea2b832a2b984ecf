"""One attempt under a hard deadline (postlane.worker.attempt): the classification by phase,
and a send that ignores its cancellation never holds the attempt past the deadline nor
passes its point of no return afterwards. Plain asyncio: no sockets, no store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass, Phase
from postlane.limiter.memory import MemoryLimiter
from postlane.providers.base import Provider
from postlane.providers.progress import AttemptAbandoned, AttemptProgress, current_progress
from postlane.providers.sandbox import SandboxProvider
from postlane.worker.attempt import Attempt, at_deadline
from tests.factories import delivery as make_delivery

X, Y = OutcomeClass.TRANSIENT, OutcomeClass.AMBIGUOUS
BEFORE = [p for p in Phase if p is not Phase.RESPONSE]


def delivery() -> Delivery:
    return make_delivery()


class Scripted(Provider):
    """Reaches ``phase``, then waits for ``release``; ``stubborn`` swallows every
    cancellation (as a library's internal ``wait_for`` can on Python 3.11). Once released
    it tries to hand the message over (``reach(RESPONSE)``) and answers ``accepted``."""

    name = "scripted"

    def __init__(self, phase: Phase | None, *, stubborn: bool = False) -> None:
        self.phase = phase
        self.stubborn = stubborn
        self.release = asyncio.Event()
        self.reached = asyncio.Event()
        self.cancellations = 0
        self.handed_over = 0
        self.refused = asyncio.Event()
        self.answered = asyncio.Event()

    async def send(self, delivery: Delivery) -> Outcome:
        progress = current_progress()
        if self.phase is not None:
            progress.reach(self.phase)
        self.reached.set()
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancellations += 1
                if not self.stubborn:
                    raise
        if self.phase is not None:
            try:
                progress.reach(Phase.RESPONSE)
            except AttemptAbandoned:
                self.refused.set()
                raise
        self.handed_over += 1
        self.answered.set()
        return Outcome.accepted("late-id", "250 ok")


@pytest.mark.parametrize("phase", BEFORE)
def test_cut_off_before_the_point_of_no_return_is_transient(phase: Phase) -> None:
    outcome = at_deadline(phase, "no answer within 1s", if_sent="left")
    assert outcome.kind is X
    assert outcome.phase is phase
    assert (outcome.response or "").startswith("not sent")
    assert str(phase) in (outcome.response or "")


def test_cut_off_after_the_point_of_no_return_is_ambiguous() -> None:
    outcome = at_deadline(Phase.RESPONSE, "no answer within 1s", if_sent="left")
    assert (outcome.kind, outcome.phase, outcome.response) == (Y, Phase.RESPONSE, "left")


def test_an_adapter_that_reports_no_phase_counts_as_past_the_point() -> None:
    outcome = at_deadline(None, "no answer within 1s", if_sent="left")
    assert (outcome.kind, outcome.phase, outcome.response) == (Y, None, "left")


async def test_an_answer_in_time_is_kept_and_marked_with_the_phase() -> None:
    provider = Scripted(Phase.ENVELOPE)
    provider.release.set()
    outcome = await Attempt(provider, delivery(), 5.0).run()
    assert outcome == Outcome.accepted("late-id", "250 ok")
    assert outcome.phase is Phase.RESPONSE


@pytest.mark.parametrize(("phase", "kind"), [(Phase.QUEUED, X), (Phase.ENVELOPE, X),
                                             (Phase.REQUEST, X), (Phase.RESPONSE, Y)])
async def test_deadline_cancels_a_cooperative_send(phase: Phase, kind: OutcomeClass) -> None:
    provider = Scripted(phase)
    outcome = await Attempt(provider, delivery(), 0.05).run()
    assert (outcome.kind, outcome.phase) == (kind, phase)
    assert provider.cancellations == 1
    assert provider.handed_over == 0


@pytest.mark.parametrize(("phase", "kind"), [(Phase.DATA, X), (Phase.RESPONSE, Y)])
async def test_deadline_is_hard_even_when_the_send_ignores_cancellation(
        phase: Phase, kind: OutcomeClass, caplog: Any) -> None:
    provider = Scripted(phase, stubborn=True)
    outcome = await Attempt(provider, delivery(), 0.05).run()
    # The attempt is decided while the send still runs: the worker did not wait for it.
    assert not provider.release.is_set()
    assert provider.cancellations >= 1
    assert (outcome.kind, outcome.phase) == (kind, phase)
    assert "ignored its cancellation" in caplog.text
    provider.release.set()
    if phase is Phase.RESPONSE:
        return
    # Released after the deadline, it may not hand the message over: the gate is shut.
    async with asyncio.timeout(5):
        await provider.refused.wait()
    assert provider.handed_over == 0


@pytest.mark.parametrize(("phase", "kind"), [(Phase.CONNECT, X), (Phase.RESPONSE, Y)])
async def test_the_deadline_runs_on_the_injected_clock(phase: Phase, kind: OutcomeClass) -> None:
    """A 30 s deadline and a send that never ends: decided without waiting in real time,
    after exactly the deadline and the cancel grace on the worker's clock."""
    from tests.clock import FakeClock

    clock = FakeClock()
    provider = Scripted(phase, stubborn=True)
    async with asyncio.timeout(5):  # real time: a wall-clock deadline would blow this
        outcome = await Attempt(provider, delivery(), 30.0, clock=clock).run()
    assert (outcome.kind, outcome.phase) == (kind, phase)
    assert "no answer within 30s" in (outcome.response or "")
    assert clock.sleeps == [30.0, 0.05]
    provider.release.set()


async def test_a_reply_after_the_deadline_is_ignored() -> None:
    """A stubborn send that gets its 250 after the deadline changes nothing: the outcome is
    the deadline's (here: it had passed the point, so ambiguous, never accepted)."""
    provider = Scripted(None, stubborn=True)  # reports no phase: may have sent
    outcome = await Attempt(provider, delivery(), 0.05).run()
    assert outcome.kind is Y
    provider.release.set()
    async with asyncio.timeout(5):
        await provider.answered.wait()  # it did answer, late, and nobody listened
    assert outcome.kind is Y


async def test_a_cancelled_attempt_is_classified_by_its_phase() -> None:
    """The worker stopping with the attempt in flight: ``stopped`` says what it was."""
    for phase, kind in ((Phase.AUTH, X), (Phase.RESPONSE, Y)):
        provider = Scripted(phase)
        attempt = Attempt(provider, delivery(), 60.0)
        task = asyncio.create_task(attempt.run())
        await provider.reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        outcome = attempt.stopped("cancelled at shutdown while in flight")
        assert (outcome.kind, outcome.phase) == (kind, phase)
        assert "cancelled at shutdown" in (outcome.response or "")


def test_progress_refuses_every_phase_once_abandoned() -> None:
    progress = AttemptProgress()
    progress.reach(Phase.CONNECT)
    assert progress.abandon() is Phase.CONNECT
    with pytest.raises(AttemptAbandoned):
        progress.reach(Phase.RESPONSE)
    assert progress.phase is Phase.CONNECT


class Throttling(Provider):
    name = "throttling"

    async def send(self, delivery: Delivery) -> Outcome:
        return Outcome.throttled(30.0, "429 Too Many Requests")


async def test_a_429_closes_the_shared_gate_inside_the_attempt() -> None:
    """The attempt itself shuts the gate, in the step the answer arrives, not the worker a
    loop iteration or two later (tests/integration/test_worker_import.py checks that no
    send of the process leaves in between)."""
    limiter = MemoryLimiter(rate=100, burst=1)
    outcome = await Attempt(Throttling(), delivery(), 5.0, limiter=limiter).run()
    assert outcome.kind is OutcomeClass.THROTTLED
    assert 29.0 < await limiter.gate_remaining_s() <= 30.0


class Recording(Provider):
    """Answers ``accepted`` and remembers every request that reached it."""

    name = "recording"

    def __init__(self) -> None:
        self.requests: list[int] = []

    async def send(self, delivery: Delivery) -> Outcome:
        self.requests.append(delivery.id)
        return Outcome.accepted(f"id-{delivery.id}", "250 ok")


async def test_a_gate_closed_after_the_slot_check_holds_the_request_back() -> None:
    """Another send's 429 lands between this send's slot check and its request: the request
    does not leave, and the attempt says so (``held_at_gate_s``) instead of reporting an
    answer, so the worker releases the delivery unspent for the gate's remaining time."""
    limiter = MemoryLimiter(rate=100, burst=1)
    provider = Recording()
    attempt = Attempt(provider, delivery(), 5.0, limiter=limiter)
    run = asyncio.ensure_future(attempt.run())
    # The attempt has started (its send task is created) but the request has not left.
    await limiter.close_gate(1.0)
    outcome = await run
    assert provider.requests == []
    assert 0.9 < attempt.held_at_gate_s <= 1.0
    assert outcome.kind is OutcomeClass.THROTTLED
    assert (outcome.response or "").startswith("not sent")


async def test_an_open_gate_holds_nothing_back() -> None:
    limiter = MemoryLimiter(rate=100, burst=1)
    provider = Recording()
    await limiter.close_gate(0)
    attempt = Attempt(provider, delivery(), 5.0, limiter=limiter)
    outcome = await attempt.run()
    assert outcome.kind is OutcomeClass.ACCEPTED
    assert provider.requests == [attempt.delivery.id]
    assert attempt.held_at_gate_s == 0


# -- the in-process sandbox reports its phases --------------------------------------------
async def test_sandbox_cut_off_on_the_way_never_reached_it() -> None:
    """Its latency is the request on its way: a deadline there is transient and the engine
    counts no request."""
    from postlane.providers.registry import open_provider

    sandbox = open_provider("sandbox://?latency_s=5")
    assert isinstance(sandbox, SandboxProvider)
    outcome = await Attempt(sandbox, delivery(), 0.05).run()
    assert (outcome.kind, outcome.phase) == (X, Phase.REQUEST)
    assert sandbox.engine.stats.requests == 0


async def test_sandbox_sitting_on_an_accepted_message_is_ambiguous() -> None:
    from postlane.providers.registry import open_provider

    sandbox = open_provider("sandbox://?timeout_rate=1&timeout_delay_s=5")
    assert isinstance(sandbox, SandboxProvider)
    outcome = await Attempt(sandbox, delivery(), 0.05).run()
    assert (outcome.kind, outcome.phase) == (Y, Phase.RESPONSE)
    assert sandbox.engine.stats.requests == 1


async def test_sandbox_answers_carry_the_phase() -> None:
    from postlane.providers.registry import open_provider

    outcome = await open_provider("sandbox://").send(delivery())
    assert outcome.kind is OutcomeClass.ACCEPTED and outcome.phase is Phase.RESPONSE
