"""The queueing text's failure table, end to end through the real Worker on both engines.

For each row: the delivery's state, attempts and next run time, the dead-letter entry
(snapshot with the rendered content and key, reason, last response verbatim and bounded,
one attempt-history entry per attempt with its outcome and duration), and the provider's
record of requests (the same key on every attempt).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from conftest import SideDB, msg
from worker_helpers import (
    Provider,
    delivery_when,
    event_kinds,
    fast_config,
    in_state,
    lanes,
    running,
)

from postlane import DeadReason, State
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.store import Store
from postlane.store.base import MAX_RESPONSE_CHARS, bound_response
from postlane.worker import Worker


def reset(key: str, **overrides: Any) -> Any:
    """A fully rendered message, so the dead-letter snapshot has something to keep."""
    fields: dict[str, Any] = {
        "html": "<p>Follow the <a href='https://x.example/r/1'>link</a>.</p>",
        "headers": {"X-Campaign": "password-reset"},
        "metadata": {"user_id": 42},
        "template_id": "reset", "template_version": 3,
    }
    fields.update(overrides)
    return msg(key, **fields)


async def assert_dead_letter(
    store: Store, d: Delivery, reason: str, *, last_response: str | None,
    outcomes: list[str],
) -> dict[str, Any]:
    """The entry keeps everything: snapshot, reason, last response, one history entry per
    attempt (in order, with the outcome and how long the attempt took)."""
    entry = await store.dead_letter(d.id)
    assert entry is not None, f"no dead-letter entry for delivery {d.id}"
    assert entry.reason == reason
    snap = entry.snapshot
    assert snap["idempotency_key"] == d.key
    assert snap["recipient"] == d.recipient
    assert snap["subject"] == d.subject
    assert snap["text_body"] == d.text
    assert snap["html_body"] == d.html
    assert snap["headers"] == d.headers
    assert snap["metadata"] == d.metadata
    assert (snap["template_id"], snap["template_version"]) == (d.template_id,
                                                               d.template_version)
    assert snap["lane"] == d.lane
    assert snap["attempts"] == d.attempts
    assert entry.last_response == last_response
    assert [h["outcome"] for h in entry.attempt_history] == outcomes
    for number, h in enumerate(entry.attempt_history, 1):
        if h["outcome"] != "throttled":
            assert h["attempt"] == number
        assert "at" in h
        assert isinstance(h["duration_ms"], int | float) and h["duration_ms"] >= 0
    assert entry.dead_at is not None
    return snap


def assert_same_key(provider: Provider, d: Delivery, attempts: int) -> None:
    requests = provider.requests_of(d.id)
    assert len(requests) == attempts
    assert {r.key for r in requests} == {d.key}


def seconds_until(side: SideDB, d: Delivery) -> float:
    return (d.run_at - side.now()).total_seconds()


# -- 429 with Retry-After: throttling ----------------------------------------------------
async def test_429_requeues_at_the_stated_delay_without_spending_an_attempt(
    store: Store, side: SideDB
) -> None:
    provider = Provider()
    provider.script_key("reset:429", Outcome.throttled(30.0, "429 Too Many Requests"))
    r = await store.enqueue(reset("reset:429"))
    async with running(Worker(store, provider, config=fast_config())):
        d = await delivery_when(store, r.id, lambda d: d.state is State.PENDING and d.claims)
        assert d.attempts == 0
        assert 28.0 < seconds_until(side, d) <= 30.5
        assert d.last_error == "429 Too Many Requests"
        side.make_due(r.id)
        d = await in_state(store, r.id, State.SENT)
    assert d.attempts == 1  # only the accepted attempt counts
    assert d.provider_message_id is not None
    assert_same_key(provider, d, 2)
    assert await event_kinds(store, r.id) == ["enqueued", "claimed", "throttled", "claimed",
                                              "sent"]
    assert await store.dead_letter(r.id) is None


# -- 503: transient ----------------------------------------------------------------------
async def test_503_backs_off_with_jitter_and_spends_attempts(
    store: Store, side: SideDB
) -> None:
    provider = Provider()
    provider.script_key("reset:503", Outcome.transient("503 Service Unavailable"),
                        Outcome.transient("503 Service Unavailable (again)"))
    r = await store.enqueue(reset("reset:503"))
    # Injected random source: every jitter is half its ceiling, so delays are known:
    # attempt 1 -> 0.5 * min(300, 10 * 2) = 10 s, attempt 2 -> 0.5 * 40 = 20 s.
    config = fast_config(retry=RetryPolicy(base_s=10.0, cap_s=300.0))
    async with running(Worker(store, provider, config=config, rand=lambda: 0.5)):
        d = await delivery_when(store, r.id, lambda d: d.attempts == 1 and d.state is
                                State.PENDING)
        assert 9.0 < seconds_until(side, d) <= 10.5
        assert d.last_error == "503 Service Unavailable"
        side.make_due(r.id)
        d = await delivery_when(store, r.id, lambda d: d.attempts == 2 and d.state is
                                State.PENDING)
        assert 19.0 < seconds_until(side, d) <= 20.5
        side.make_due(r.id)
        d = await in_state(store, r.id, State.SENT)
    assert d.attempts == 3
    assert_same_key(provider, d, 3)
    retries = [e.data for e in await store.timeline(r.id) if e.kind == "retry_scheduled"]
    assert [(e["attempt"], e["delay_s"], e["outcome"]) for e in retries] == [
        (1, 10.0, "transient"), (2, 20.0, "transient")]
    assert all(e["duration_ms"] >= 0 for e in retries)


# -- connection timeout: ambiguous -------------------------------------------------------
TIMEOUT = 0.2


async def test_timeout_with_a_deduplicating_provider_retries_with_the_same_key(
    store: Store,
) -> None:
    provider = Provider(deduplicate=True)
    provider.hang("reset:t1", 5.0)  # accepted, but the answer comes after the timeout
    r = await store.enqueue(reset("reset:t1"))
    async with running(Worker(store, provider, config=fast_config(attempt_timeout_s=TIMEOUT))):
        d = await in_state(store, r.id, State.SENT)
    assert d.attempts == 2
    assert_same_key(provider, d, 2)
    # The provider recognised the repeat: the recipient got one message.
    assert provider.duplicates_suppressed == 1 and provider.duplicates == 0
    kinds = await event_kinds(store, r.id)
    assert kinds == ["enqueued", "claimed", "ambiguous_retry", "claimed", "sent"]
    first = next(e for e in await store.timeline(r.id) if e.kind == "ambiguous_retry")
    assert first.data["outcome"] == "ambiguous"
    assert first.data["duration_ms"] >= TIMEOUT * 1000 * 0.9


async def test_timeout_without_dedupe_or_lookup_is_held_for_an_operator(
    store: Store, side: SideDB
) -> None:
    provider = Provider(deduplicate=False, lookup=False)
    provider.hang("reset:t2", 5.0)
    r = await store.enqueue(reset("reset:t2"))
    worker = Worker(store, provider, config=fast_config(attempt_timeout_s=TIMEOUT))
    async with running(worker):
        d = await in_state(store, r.id, State.AMBIGUOUS)
        # Several rescue/reconcile rounds later it is still held: never re-sent blindly.
        await asyncio.sleep(0.3)  # a few caretaker rounds (rescue, reconcile) go by
        for _ in range(2):
            await worker.reconcile_ambiguous()
        d = await in_state(store, r.id, State.AMBIGUOUS)
    assert d.attempts == 1
    assert d.last_error == f"no answer within {TIMEOUT:g}s after the request left"
    assert d.lease_owner is None
    assert_same_key(provider, d, 1)
    assert provider.duplicates == 0
    assert await store.dead_letter(r.id) is None
    held = [e.data for e in await store.timeline(r.id) if e.kind == "ambiguous"]
    assert held and held[0]["resolution"] == "held for an operator"
    assert side.count("postlane_deliveries", "state = 'sending'") == 0


async def test_timeout_under_lane_policy_resend_sends_again(store: Store) -> None:
    provider = Provider(deduplicate=False, lookup=False)
    provider.hang("reset:t3", 5.0)
    r = await store.enqueue(reset("reset:t3"))
    config = fast_config(attempt_timeout_s=TIMEOUT, lanes=lanes(on_ambiguous="resend"))
    async with running(Worker(store, provider, config=config)):
        d = await in_state(store, r.id, State.SENT)
    assert d.attempts == 2
    assert_same_key(provider, d, 2)
    # The lane accepted the risk of a duplicate, and here it happened.
    assert provider.duplicates == 1
    assert "ambiguous_resend" in await event_kinds(store, r.id)


async def test_timeout_with_a_lookup_capable_provider_is_reconciled_by_lookup(
    store: Store,
) -> None:
    provider = Provider(deduplicate=False, lookup=True)
    provider.hang("reset:t4", 5.0)
    r = await store.enqueue(reset("reset:t4"))
    async with running(Worker(store, provider, config=fast_config(attempt_timeout_s=TIMEOUT))):
        d = await in_state(store, r.id, State.SENT)
    assert d.attempts == 1
    assert d.provider_message_id == provider.accepted["reset:t4"]
    assert_same_key(provider, d, 1)  # looked up, not re-sent
    kinds = await event_kinds(store, r.id)
    assert kinds == ["enqueued", "claimed", "ambiguous", "reconciled"]


# -- 400 / 404: permanent ----------------------------------------------------------------
@pytest.mark.parametrize("response", [
    "400 Bad Request: malformed address 'bob@@example.com'",
    "404 Not Found: template 'reset' version 3 does not exist",
])
async def test_permanent_rejections_dead_letter_at_once(
    store: Store, response: str
) -> None:
    provider = Provider()
    provider.script_key("reset:perm", Outcome.permanent(response))
    r = await store.enqueue(reset("reset:perm"))
    async with running(Worker(store, provider, config=fast_config())):
        d = await in_state(store, r.id, State.DEAD)
    assert (d.attempts, d.dead_reason, d.last_error) == (1, DeadReason.PERMANENT, response)
    assert d.finished_at is not None and d.lease_owner is None
    await assert_dead_letter(store, d, DeadReason.PERMANENT, last_response=response,
                             outcomes=["permanent"])
    assert_same_key(provider, d, 1)


async def test_a_huge_provider_response_is_kept_verbatim_but_bounded(store: Store) -> None:
    page = "400 Bad Request\n<html>" + "".join(f"<p>line {i}</p>" for i in range(2000))
    assert len(page) > 10 * MAX_RESPONSE_CHARS
    provider = Provider()
    provider.script_key("reset:html", Outcome.permanent(page))
    r = await store.enqueue(reset("reset:html"))
    async with running(Worker(store, provider, config=fast_config())):
        d = await in_state(store, r.id, State.DEAD)
    entry = await store.dead_letter(r.id)
    assert entry is not None
    assert entry.last_response == bound_response(page)
    assert entry.last_response is not None
    assert entry.last_response.startswith(page[:MAX_RESPONSE_CHARS])
    assert len(entry.last_response) < MAX_RESPONSE_CHARS + 100
    assert entry.attempt_history[0]["response"] == page[:500]
    assert d.last_error == entry.last_response


# -- retry budget exhausted --------------------------------------------------------------
async def test_budget_exhausted_dead_letters_with_the_full_history(store: Store) -> None:
    provider = Provider()
    provider.script_key("reset:budget", *(Outcome.transient(f"503 try {i}") for i in (1, 2, 3)))
    r = await store.enqueue(reset("reset:budget"))
    config = fast_config(lanes=lanes(max_attempts=3))
    async with running(Worker(store, provider, config=config)):
        d = await in_state(store, r.id, State.DEAD)
    assert (d.attempts, d.dead_reason) == (3, DeadReason.BUDGET_EXHAUSTED)
    await assert_dead_letter(store, d, DeadReason.BUDGET_EXHAUSTED,
                             last_response="503 try 3",
                             outcomes=["transient", "transient", "transient"])
    entry = await store.dead_letter(r.id)
    assert entry is not None
    assert [h["response"] for h in entry.attempt_history] == ["503 try 1", "503 try 2",
                                                              "503 try 3"]
    assert entry.attempt_history[-1]["max_attempts"] == 3
    assert_same_key(provider, d, 3)


async def test_throttles_do_not_count_towards_the_budget(store: Store) -> None:
    provider = Provider()
    provider.script_key("reset:mix", Outcome.throttled(0.01, "429"),
                        Outcome.transient("503 a"), Outcome.throttled(0.01, "429"),
                        Outcome.throttled(0.01, "429"), Outcome.transient("503 b"))
    r = await store.enqueue(reset("reset:mix"))
    config = fast_config(lanes=lanes(max_attempts=3))
    async with running(Worker(store, provider, config=config)):
        d = await in_state(store, r.id, State.SENT)
    assert d.attempts == 3  # two failures and the success; the three 429s were free
    assert_same_key(provider, d, 6)


# -- expiry ------------------------------------------------------------------------------
async def test_a_retry_that_would_land_after_expiry_expires(store: Store) -> None:
    provider = Provider()
    provider.script_key("reset:exp", Outcome.transient("503 Service Unavailable"))
    r = await store.enqueue(reset("reset:exp", expires_in=timedelta(seconds=5)))
    # Backoff 0.9 * min(300, 10 * 2) = 18 s: past the 5 s the message is useful for.
    config = fast_config(retry=RetryPolicy(base_s=10.0, cap_s=300.0))
    async with running(Worker(store, provider, config=config, rand=lambda: 0.9)):
        d = await in_state(store, r.id, State.EXPIRED)
    assert d.attempts == 1
    assert d.finished_at is not None
    await assert_dead_letter(store, d, DeadReason.EXPIRED,
                             last_response="503 Service Unavailable", outcomes=["transient"])
    expired = [e.data for e in await store.timeline(r.id) if e.kind == "expired"]
    assert expired[0]["why"] == "the next attempt would land after expires_at"
    assert expired[0]["delay_s"] == 18.0
    assert_same_key(provider, d, 1)


async def test_expired_before_sending_is_never_sent(store: Store, side: SideDB) -> None:
    provider = Provider()
    r = await store.enqueue(reset("reset:stale", expires_in=timedelta(minutes=15)))
    side.shift(r.id, "expires_at", -1.0)
    async with running(Worker(store, provider, config=fast_config())):
        d = await in_state(store, r.id, State.EXPIRED)
    assert d.attempts == 0
    assert provider.requests == []
    entry = await store.dead_letter(r.id)
    assert entry is not None
    assert entry.reason == DeadReason.EXPIRED
    assert entry.snapshot["idempotency_key"] == "reset:stale"
    assert entry.snapshot["html_body"] == d.html
    assert entry.attempt_history == []  # no attempt was made
    assert entry.last_response == "past expires_at before sending"


# -- handler error -----------------------------------------------------------------------
async def test_an_exception_in_the_adapter_dead_letters_with_its_traceback(
    store: Store,
) -> None:
    provider = Provider()
    provider.raise_for["reset:bug"] = KeyError("template variable 'first_name'")
    r = await store.enqueue(reset("reset:bug"))
    other = await store.enqueue(reset("reset:fine"))
    async with running(Worker(store, provider, config=fast_config())) as task:
        d = await in_state(store, r.id, State.DEAD)
        await in_state(store, other.id, State.SENT)  # the worker carries on
        assert not task.done()
    assert (d.attempts, d.dead_reason) == (1, DeadReason.HANDLER_ERROR)
    entry = await store.dead_letter(r.id)
    assert entry is not None and entry.reason == DeadReason.HANDLER_ERROR
    assert entry.last_response is not None
    assert "Traceback (most recent call last)" in entry.last_response
    assert "KeyError: \"template variable 'first_name'\"" in entry.last_response
    [attempt] = entry.attempt_history
    assert attempt["outcome"] == "handler_error"
    assert "KeyError" in attempt["traceback"]
    assert "duration_ms" in attempt
    assert_same_key(provider, d, 1)
