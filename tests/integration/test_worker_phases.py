"""Ambiguous only past the point of no return, end to end: the real Worker, the real SMTP
adapter and a real (misbehaving) SMTP server on loopback, on both store engines.

For every step of the SMTP dialogue the server stalls or hangs up there, and the test
checks the delivery's exact state, the phase its timeline names, and how many messages the
server received. Only the final dot hands a message over, so only a failure after it may
be ambiguous; everything before is transient (retried, never held).

Stalls are cut off two ways: by the worker's attempt deadline (the SMTP client's own
command timeout set far away) and by the client's own command timeout (the deadline far
away). Both must classify the same.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import msg
from misbehaving_smtp import STEPS, MisbehavingSMTP, Misbehaviour, Step, misbehaving_smtp
from worker_helpers import delivery_when, fast_config, lanes, running

from postlane.core.outcomes import Phase
from postlane.core.policy import RetryPolicy
from postlane.core.states import State
from postlane.providers.smtp import SMTPProvider
from postlane.store import Store
from postlane.worker import Worker

PHASE_OF: dict[Step, Phase] = {
    "greeting": Phase.CONNECT, "ehlo": Phase.HELLO, "auth": Phase.AUTH,
    "mail": Phase.ENVELOPE, "rcpt": Phase.ENVELOPE, "data": Phase.DATA,
    "dot": Phase.RESPONSE,
}

NEVER = 600.0
"""A timeout that must not be the one firing."""


def worker_for(store: Store, url: str, *, attempt_timeout_s: float) -> Worker:
    """One attempt, then a retry far in the future (jitter pinned to half its ceiling), so
    the state after the first attempt is the one the test reads."""
    config = fast_config(attempt_timeout_s=attempt_timeout_s, lanes=lanes(max_attempts=3),
                         retry=RetryPolicy(base_s=NEVER, cap_s=NEVER))
    return Worker(store, SMTPProvider.from_url(url), config=config, rand=lambda: 0.5)


async def first_attempt(store: Store, key: str) -> Any:
    """The delivery once its first attempt is decided, and that decision's event."""
    d = await delivery_when(store, key, lambda d: d.claims == 1 and d.state is not
                            State.SENDING, what=f"{key} attempted once")
    events = await store.timeline(d.id)
    return d, events


async def check_attempt(store: Store, key: str, step: Step, server: MisbehavingSMTP) -> None:
    d, events = await first_attempt(store, key)
    received = len(server.received)
    decided = events[-1]
    assert decided.data["phase"] == PHASE_OF[step]
    assert decided.data["attempt"] == 1
    if step == "dot":
        # The server read the final dot: it may deliver, so the attempt is held.
        assert received == 1
        assert d.state is State.AMBIGUOUS
        assert [e.kind for e in events] == ["enqueued", "claimed", "ambiguous"]
        assert decided.data["outcome"] == "ambiguous"
        assert decided.data["resolution"] == "held for an operator"
    else:
        # Nothing reached the server: retried with backoff, an attempt spent, never held.
        assert received == 0
        assert d.state is State.PENDING
        assert d.attempts == 1 and d.claims == 1
        assert d.lease_owner is None
        assert [e.kind for e in events] == ["enqueued", "claimed", "retry_scheduled"]
        assert decided.data["outcome"] == "transient"
        assert decided.data["delay_s"] == NEVER / 2
        assert (d.last_error or "").startswith("not sent")


@pytest.mark.parametrize("step", STEPS)
async def test_stall_cut_off_by_the_attempt_deadline(store: Store, step: Step) -> None:
    async with misbehaving_smtp(step, "stall") as server:
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&from=noreply@example.com&timeout={NEVER:g}"
        r = await store.enqueue(msg(f"phase:{step}"))
        async with running(worker_for(store, url, attempt_timeout_s=0.4)):
            await check_attempt(store, r.key, step, server)
        assert server.reached[-1] == step  # it stalled where the test asked


@pytest.mark.parametrize("step", STEPS)
async def test_stall_cut_off_by_the_client_timeout(store: Store, step: Step) -> None:
    async with misbehaving_smtp(step, "stall") as server:
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&from=noreply@example.com&timeout=0.3"
        r = await store.enqueue(msg(f"phase:{step}"))
        async with running(worker_for(store, url, attempt_timeout_s=NEVER)):
            await check_attempt(store, r.key, step, server)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("how", ["drop"])
async def test_connection_dropped(store: Store, step: Step, how: Misbehaviour) -> None:
    async with misbehaving_smtp(step, how) as server:
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&from=noreply@example.com&timeout={NEVER:g}"
        r = await store.enqueue(msg(f"phase:{step}"))
        async with running(worker_for(store, url, attempt_timeout_s=NEVER)):
            await check_attempt(store, r.key, step, server)
        assert server.reached[-1] == step


async def test_a_well_behaved_server_is_sent_in_phase_response(store: Store) -> None:
    async with misbehaving_smtp() as server:
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&from=noreply@example.com"
        r = await store.enqueue(msg("phase:none"))
        async with running(worker_for(store, url, attempt_timeout_s=NEVER)):
            d, events = await first_attempt(store, r.key)
    assert d.state is State.SENT
    assert events[-1].data["phase"] == Phase.RESPONSE
    assert len(server.received) == 1
    assert server.reached == ["greeting", "ehlo", "auth", "mail", "rcpt", "data", "dot"]
