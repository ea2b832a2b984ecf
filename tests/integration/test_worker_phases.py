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

import asyncio
from typing import Any

import pytest
from conftest import msg
from misbehaving_http import MisbehavingHTTP, Point, misbehaving_http, small_buffers_transport
from misbehaving_http import Misbehaviour as HttpMisbehaviour
from misbehaving_smtp import STEPS, MisbehavingSMTP, Step, misbehaving_smtp
from worker_helpers import delivery_when, fast_config, lanes, running

from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, Phase
from postlane.core.policy import RetryPolicy
from postlane.core.states import State
from postlane.providers.base import Provider
from postlane.providers.http import JsonHttpProvider
from postlane.providers.progress import AttemptAbandoned, current_progress
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
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&allow_plain_auth=1&from=noreply@example.com&timeout={NEVER:g}"
        r = await store.enqueue(msg(f"phase:{step}"))
        # 1 s: the steps before the stall must fit in it on a loaded machine (0.4 s did not,
        # once, at a load of 4: the deadline then cut the dialogue off a step early).
        async with running(worker_for(store, url, attempt_timeout_s=1.0)):
            await check_attempt(store, r.key, step, server)
        assert server.reached[-1] == step  # it stalled where the test asked


@pytest.mark.parametrize("step", STEPS)
async def test_stall_cut_off_by_the_client_timeout(store: Store, step: Step) -> None:
    async with misbehaving_smtp(step, "stall") as server:
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&allow_plain_auth=1&from=noreply@example.com&timeout=0.3"
        r = await store.enqueue(msg(f"phase:{step}"))
        async with running(worker_for(store, url, attempt_timeout_s=NEVER)):
            await check_attempt(store, r.key, step, server)


@pytest.mark.parametrize("step", STEPS)
async def test_connection_dropped(store: Store, step: Step) -> None:
    async with misbehaving_smtp(step, "drop") as server:
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&allow_plain_auth=1&from=noreply@example.com&timeout={NEVER:g}"
        r = await store.enqueue(msg(f"phase:{step}"))
        async with running(worker_for(store, url, attempt_timeout_s=NEVER)):
            await check_attempt(store, r.key, step, server)
        assert server.reached[-1] == step


async def test_a_well_behaved_server_is_sent_in_phase_response(store: Store) -> None:
    async with misbehaving_smtp() as server:
        url = f"smtp://user:secret@127.0.0.1:{server.port}?starttls=0&allow_plain_auth=1&from=noreply@example.com"
        r = await store.enqueue(msg("phase:none"))
        async with running(worker_for(store, url, attempt_timeout_s=NEVER)):
            d, events = await first_attempt(store, r.key)
    assert d.state is State.SENT
    assert events[-1].data["phase"] == Phase.RESPONSE
    assert len(server.received) == 1
    assert server.reached == ["greeting", "ehlo", "auth", "mail", "rcpt", "data", "dot"]


# == HTTP ==================================================================================
BIG = "x" * 600_000
"""A body far larger than the small socket buffers: stuck in the client while unread."""


def http_worker_for(store: Store, server: MisbehavingHTTP, *, attempt_timeout_s: float,
                    client_timeout_s: float = NEVER) -> Worker:
    # dedupe off: a possibly-sent request is held, not resent under the same key.
    provider = JsonHttpProvider(server.url, deduplicates=False, timeout_s=client_timeout_s,
                                default_sender="noreply@example.com",
                                transport=small_buffers_transport())
    config = fast_config(attempt_timeout_s=attempt_timeout_s, lanes=lanes(max_attempts=3),
                         retry=RetryPolicy(base_s=NEVER, cap_s=NEVER))
    return Worker(store, provider, config=config, rand=lambda: 0.5)


async def check_http_attempt(store: Store, key: str, server: MisbehavingHTTP,
                             *, sent: bool) -> None:
    d, events = await first_attempt(store, key)
    decided = events[-1]
    assert server.started == 1
    if sent:
        assert len(server.received) == 1
        assert d.state is State.AMBIGUOUS
        assert [e.kind for e in events] == ["enqueued", "claimed", "ambiguous"]
        assert decided.data["phase"] == Phase.RESPONSE
    else:
        assert server.received == []
        assert d.state is State.PENDING and d.attempts == 1
        assert [e.kind for e in events] == ["enqueued", "claimed", "retry_scheduled"]
        assert decided.data["phase"] == Phase.REQUEST
        assert (d.last_error or "").startswith("not sent")


@pytest.mark.parametrize("cut_off_by", ["attempt deadline", "client timeout", "drop"])
@pytest.mark.parametrize("at", ["headers", "body"])
async def test_http_server_misbehaving_before_and_after_the_whole_request(
        store: Store, at: Point, cut_off_by: str) -> None:
    """Stalled or dropped before it read the body: transient. After it read the whole
    request: ambiguous, held (this API does not deduplicate)."""
    how: HttpMisbehaviour = "drop" if cut_off_by == "drop" else "stall"
    async with misbehaving_http(at, how) as server:
        r = await store.enqueue(msg(f"http:{at}", text=BIG))
        if cut_off_by == "attempt deadline":
            worker = http_worker_for(store, server, attempt_timeout_s=0.5)
        else:
            worker = http_worker_for(store, server, attempt_timeout_s=NEVER,
                                     client_timeout_s=0.3)
        async with running(worker):
            await check_http_attempt(store, r.key, server, sent=at == "body")


async def test_http_well_behaved_server_is_sent(store: Store) -> None:
    async with misbehaving_http() as server:
        r = await store.enqueue(msg("http:ok", text=BIG))
        async with running(http_worker_for(store, server, attempt_timeout_s=NEVER)):
            d, events = await first_attempt(store, r.key)
    assert d.state is State.SENT
    assert events[-1].data["phase"] == Phase.RESPONSE
    assert [len(body) > len(BIG) for body in server.received] == [True]


# == SES ===================================================================================
@pytest.fixture
def small_botocore_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's sockets get small send buffers too, so a body the server does not read is
    really stuck in the client (loopback's default buffers would swallow it whole)."""
    import socket

    import botocore.args
    from misbehaving_http import BUFFER

    compute = botocore.args.ClientArgsCreator._compute_socket_options

    def small(self: Any, *args: Any, **kwargs: Any) -> Any:
        return [*compute(self, *args, **kwargs), (socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)]

    monkeypatch.setattr(botocore.args.ClientArgsCreator, "_compute_socket_options", small)


def ses_worker_for(store: Store, server: MisbehavingHTTP, *, attempt_timeout_s: float,
                   client_timeout_s: float = NEVER) -> Worker:
    from postlane.providers.ses import SESProvider

    url = (f"ses://testing:secret@us-east-1?endpoint_url=http://127.0.0.1:{server.port}"
           f"&timeout={client_timeout_s:g}&from=noreply@example.com")
    config = fast_config(attempt_timeout_s=attempt_timeout_s, lanes=lanes(max_attempts=3),
                         retry=RetryPolicy(base_s=NEVER, cap_s=NEVER))
    return Worker(store, SESProvider.from_url(url), config=config, rand=lambda: 0.5)


@pytest.mark.usefixtures("small_botocore_buffers")
@pytest.mark.parametrize("cut_off_by", ["attempt deadline", "client timeout", "drop"])
@pytest.mark.parametrize("at", ["headers", "body"])
async def test_ses_endpoint_misbehaving_before_and_after_the_whole_request(
        store: Store, at: Point, cut_off_by: str) -> None:
    """SES through botocore: its point of no return is the request's last bytes handed to
    the socket (not the start of the HTTP exchange), so an endpoint that stalls or drops
    before reading the whole body leaves the attempt transient, and one that read it all
    leaves it ambiguous."""
    how: HttpMisbehaviour = "drop" if cut_off_by == "drop" else "stall"
    async with misbehaving_http(at, how) as server:
        r = await store.enqueue(msg(f"ses:{at}", text=BIG))
        if cut_off_by == "attempt deadline":
            worker = ses_worker_for(store, server, attempt_timeout_s=0.5)
        else:
            worker = ses_worker_for(store, server, attempt_timeout_s=NEVER,
                                    client_timeout_s=0.3)
        async with running(worker):
            await check_http_attempt(store, r.key, server, sent=at == "body")


# == the hard bound ========================================================================
class Stubborn(Provider):
    """Reaches ``phase`` and then swallows every cancellation until released (as a
    library's internal ``wait_for`` can on Python 3.11); released, it tries to hand the
    message over."""

    name = "stubborn"

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self.release = asyncio.Event()
        self.cancellations = 0
        self.handed_over = 0
        self.refused = asyncio.Event()

    async def send(self, delivery: Delivery) -> Outcome:
        progress = current_progress()
        progress.reach(self.phase)
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancellations += 1
        try:
            progress.reach(Phase.RESPONSE)
        except AttemptAbandoned:
            self.refused.set()
            raise
        self.handed_over += 1
        return Outcome.accepted("late")


@pytest.mark.parametrize("phase", [Phase.ENVELOPE, Phase.RESPONSE])
async def test_the_deadline_holds_when_the_send_ignores_its_cancellation(
        store: Store, phase: Phase) -> None:
    provider = Stubborn(phase)
    config = fast_config(attempt_timeout_s=0.3, lanes=lanes(max_attempts=3),
                         retry=RetryPolicy(base_s=NEVER, cap_s=NEVER))
    r = await store.enqueue(msg("stubborn"))
    async with running(Worker(store, provider, config=config, rand=lambda: 0.5)):
        d, events = await first_attempt(store, r.key)
        # Decided while the send still hangs: the worker stopped waiting at the deadline.
        assert not provider.release.is_set() and provider.cancellations >= 1
        assert events[-1].data["phase"] == phase
        if phase is Phase.RESPONSE:
            assert d.state is State.AMBIGUOUS
        else:
            assert (d.state, d.attempts) == (State.PENDING, 1)
            provider.release.set()
            async with asyncio.timeout(5):
                await provider.refused.wait()  # too late to pass the point of no return
            assert provider.handed_over == 0
        provider.release.set()
    final = await store.get(r.id)
    assert final is not None and final.state is d.state  # nothing the late send did counted
