"""Status callbacks (issue 16 part 3), on both engines, to a receiver on loopback that
verifies every request with the ``standardwebhooks`` package (the reference implementation
of the scheme), including a receiver that is down for a while, one that reads the request
and then never answers (the sender times out; the event comes again, with the same id),
and one that stays down past the budget (a dead callback, then replayed)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from postlane.callbacks import CallbackConfig, CallbackSender, register_endpoint
from postlane.core.message import Message
from postlane.core.outcomes import Outcome
from postlane.core.records import ProviderEvent
from postlane.core.states import State
from postlane.errors import ConfigurationError
from postlane.metrics import WorkerMetrics
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.worker import Worker
from tests.conftest import msg
from tests.integration.worker_helpers import all_terminal, fast_config, running, wait_until

FAST = CallbackConfig(timeout_s=0.5, max_attempts=50, base_s=0.02, cap_s=0.1, lease_s=5.0,
                      interval_s=0.02)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Receiver:
    """The application's endpoint: verifies each request's signature with
    ``standardwebhooks`` (a request that fails is answered 400 and not recorded), keeps
    every event once by its ``webhook-id`` and counts the repeats. ``stall``: read the whole
    request, then never answer (until released)."""

    def __init__(self, secret: str) -> None:
        self.webhook = Webhook(secret)
        self.events: dict[str, dict[str, Any]] = {}
        self.seen: Counter[str] = Counter()
        self.rejected = 0
        self.stall = False
        self.stalled: list[str] = []
        self._release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip()
                       for k, v in (line.split(":", 1) for line in head[1:] if ":" in line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            try:
                payload = self.webhook.verify(body, headers)
            except Exception:
                self.rejected += 1
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
                return
            message_id = headers["webhook-id"]
            self.seen[message_id] += 1
            self.events.setdefault(message_id, payload)
            if self.stall:
                self.stalled.append(message_id)
                await self._release.wait()
                return
            writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    def release(self) -> None:
        self._release.set()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events.values() if e["type"] == kind]


@asynccontextmanager
async def serving(receiver: Receiver, port: int) -> AsyncIterator[None]:
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", port)
    try:
        yield
    finally:
        receiver.release()
        server.close()
        await server.wait_closed()


async def test_events_reach_a_receiver_that_was_down_for_a_while(store: Store) -> None:
    port = free_port()
    endpoint = await register_endpoint(store, f"http://127.0.0.1:{port}/postlane")
    assert endpoint.secret.startswith("whsec_") and endpoint.events == ()
    receiver = Receiver(endpoint.secret)
    provider = RecordingProvider()
    provider.script_key("receipt:bad", Outcome.permanent("550 5.1.1 no such user"))
    await store.suppress("gone@example.com", "*", "hard bounce")
    await store.enqueue_many([msg("receipt:1"), msg("receipt:2"), msg("receipt:bad"),
                              msg("receipt:gone", to="gone@example.com")])
    sender = CallbackSender(store, FAST)
    worker = Worker(store, provider, callbacks=sender, config=fast_config())
    async with running(worker):
        await all_terminal(store)
        delivery = await store.get("receipt:2")
        assert delivery is not None and delivery.provider_message_id is not None
        await store.record_provider_event(ProviderEvent(
            "recording", "evt-bounce-1", "bounced", delivery.provider_message_id,
            data={"bounce_type": "Permanent"}))
        # Down: nothing listens yet; every attempt fails and is retried.
        await wait_until(lambda: sender.counters["retry"] >= 10, what="retries while down")
        assert not receiver.events
        async with serving(receiver, port):
            await wait_until(lambda: len(receiver.events) == 5, what="all five events")
            await wait_until(lambda: sender.counters["sent"] == 5, what="five acknowledged")

    assert receiver.rejected == 0  # every request verified with standardwebhooks
    by_key = {(e["type"], e["data"]["key"]): e["data"] for e in receiver.events.values()}
    assert set(by_key) == {("delivery.sent", "receipt:1"), ("delivery.sent", "receipt:2"),
                           ("delivery.dead_lettered", "receipt:bad"),
                           ("delivery.suppressed", "receipt:gone"),
                           ("delivery.bounced", "receipt:2")}
    sent = by_key[("delivery.sent", "receipt:1")]
    assert sent["lane"] == "interactive" and sent["provider"] == "recording"
    assert sent["state"] == "sent" and sent["event_id"].startswith("evt_")
    dead = by_key[("delivery.dead_lettered", "receipt:bad")]
    assert dead["cause"] == "550 5.1.1 no such user" and dead["dead_reason"] == "permanent"
    assert dead["provider"] == "recording"
    assert "suppressed" in by_key[("delivery.suppressed", "receipt:gone")]["cause"]
    assert by_key[("delivery.bounced", "receipt:2")]["cause"] == "Permanent"
    # The webhook-id is the event's id, the same in the payload.
    assert all(e["data"]["event_id"] == mid for mid, e in receiver.events.items())

    callbacks = await store.list_callbacks()
    assert {c.state for c in callbacks} == {"sent"}
    assert max(c.attempts for c in callbacks) > 1
    delivery = await store.get("receipt:1")
    assert delivery is not None
    kinds = [e.kind for e in await store.timeline(delivery.id)]
    assert kinds[-2:] == ["sent", "callback_sent"]


async def test_a_receiver_that_times_out_after_reading_gets_the_event_again(
        store: Store) -> None:
    port = free_port()
    endpoint = await register_endpoint(store, f"http://127.0.0.1:{port}/hook")
    receiver = Receiver(endpoint.secret)
    receiver.stall = True
    sender = CallbackSender(store, FAST)
    await store.enqueue(msg("reset:1"))
    worker = Worker(store, RecordingProvider(), callbacks=sender, config=fast_config())
    async with serving(receiver, port), running(worker):
        await wait_until(lambda: len(receiver.stalled) >= 2, what="two timed-out attempts")
        receiver.stall = False
        await wait_until(lambda: sender.counters["sent"] == 1, what="the event acknowledged")
    (message_id,) = receiver.events
    assert receiver.seen[message_id] >= 3  # the same id each time: the receiver deduplicates
    assert set(receiver.stalled) == {message_id}
    (callback,) = await store.list_callbacks()
    assert callback.state == "sent" and callback.attempts == receiver.seen[message_id]
    assert callback.last_error is not None and "Timeout" in callback.last_error


async def test_a_callback_past_its_budget_is_dead_and_replayable(store: Store) -> None:
    port = free_port()
    endpoint = await register_endpoint(store, f"http://127.0.0.1:{port}/hook",
                                       events=["delivery.sent"])
    receiver = Receiver(endpoint.secret)
    sender = CallbackSender(store, CallbackConfig(timeout_s=0.5, max_attempts=3, base_s=0.01,
                                                  cap_s=0.02, interval_s=0.02))
    provider = RecordingProvider()
    provider.script_key("w:bad", Outcome.permanent("550 no"))
    await store.enqueue_many([msg("w:1"), msg("w:bad")])
    worker = Worker(store, provider, callbacks=sender, config=fast_config())
    async with running(worker):
        await wait_until(lambda: sender.counters["dead"] == 1, what="a dead callback")
        (dead,) = await store.list_callbacks(state="dead")
        assert dead.attempts == 3 and dead.type == "delivery.sent"  # dead letters: filtered
        delivery = await store.get("w:1")
        assert delivery is not None
        timeline = await store.timeline(delivery.id)
        assert timeline[-1].kind == "callback_dead"
        assert timeline[-1].data["event_id"] == dead.message_id
        async with serving(receiver, port):
            assert await store.replay_callbacks() == 1
            await wait_until(lambda: sender.counters["sent"] == 1, what="the replay sent")
    assert list(receiver.events) == [dead.message_id]
    text = WorkerMetrics(worker).render().decode()
    for line in ('postlane_callbacks_total{outcome="dead"} 1.0',
                 'postlane_callbacks_total{outcome="sent"} 1.0',
                 'postlane_callbacks_total{outcome="retry"} 2.0'):
        assert line in text, line
    (replayed,) = await store.list_callbacks()
    assert replayed.state == "sent" and replayed.attempts == 1


async def test_an_endpoint_of_one_api_key_hears_only_of_its_deliveries(store: Store) -> None:
    mine = await store.create_api_key("app", "pl_mine", "hash-mine", ["send"])
    other = await store.create_api_key("other", "pl_othe", "hash-other", ["send"])
    endpoint = await register_endpoint(store, "http://127.0.0.1:9/hook", api_key_id=mine.id,
                                       keys=store)
    await store.enqueue_request(Message(key="mine:1", to="a@example.com", text="x"), "h1",
                                f"apikey:{mine.id}")
    await store.enqueue_request(Message(key="other:1", to="b@example.com", text="x"), "h2",
                                f"apikey:{other.id}")
    await store.enqueue(msg("app:1"))
    worker = Worker(store, RecordingProvider(), config=fast_config(drain=True))
    await worker.run()
    callbacks = await store.list_callbacks()
    assert [(c.endpoint_id, c.payload["data"]["key"]) for c in callbacks] == [
        (endpoint.id, "mine:1")]
    assert await store.list_callback_endpoints(mine.id, every_key=False) == [endpoint]
    assert await store.list_callback_endpoints(other.id, every_key=False) == []
    assert not await store.disable_callback_endpoint(endpoint.id, api_key_id=other.id)
    assert await store.disable_callback_endpoint(endpoint.id, api_key_id=mine.id)


async def test_no_endpoint_no_callbacks_and_bad_registrations_store_nothing(
        store: Store) -> None:
    await store.enqueue(msg("quiet:1"))
    await Worker(store, RecordingProvider(), config=fast_config(drain=True)).run()
    assert await store.list_callbacks() == []
    assert await store.callback_counts() == {}
    for url, events in (("ftp://example.com/x", ()), ("http:///nohost", ()),
                        ("https://example.com/x", ("delivery.opened",))):
        with pytest.raises(ConfigurationError):
            await register_endpoint(store, url, events=events)
    with pytest.raises(ConfigurationError, match="no active API key"):
        await register_endpoint(store, "https://example.com/x", api_key_id=999, keys=store)
    assert await store.list_callback_endpoints() == []


async def test_the_callback_is_enqueued_with_the_transition(store: Store) -> None:
    """Written by the statement that writes the outcome, in its transaction: a state change
    without its callback, or a callback without its state change, cannot be observed."""
    await register_endpoint(store, "https://example.com/hook")
    created = await store.enqueue(msg("atomic:1"))
    worker = Worker(store, RecordingProvider(), config=fast_config(drain=True))
    await worker.run()
    delivery = await store.get(created.id)
    assert delivery is not None and delivery.state is State.SENT
    (callback,) = await store.list_callbacks()
    sent_event = [e for e in await store.timeline(created.id) if e.kind == "sent"][-1]
    assert callback.event_id == sent_event.id and callback.state == "pending"
    assert json.loads(json.dumps(callback.payload))["data"]["key"] == "atomic:1"


async def test_removing_endpoints_stops_their_callbacks(store: Store) -> None:
    first = await register_endpoint(store, "https://one.example.com/hook")
    second = await register_endpoint(store, "https://two.example.com/hook")
    await store.enqueue(msg("r:1"))
    await Worker(store, RecordingProvider(), config=fast_config(drain=True)).run()
    assert await store.disable_callback_endpoint(first.id)
    claimed = await store.claim_callbacks(10, 60.0)
    assert [c.endpoint_id for c in claimed] == [second.id]
    (dropped,) = await store.list_callbacks(state="dead")
    assert dropped.endpoint_id == first.id and dropped.last_error == "endpoint disabled"
    assert await store.disable_callback_endpoint(second.id)  # the last one: nothing queued
    await store.enqueue(msg("r:2"))
    await Worker(store, RecordingProvider(), config=fast_config(drain=True)).run()
    assert len(await store.list_callbacks()) == 2
    third = await register_endpoint(store, "https://three.example.com/hook")  # and back
    await store.enqueue(msg("r:3"))
    await Worker(store, RecordingProvider(), config=fast_config(drain=True)).run()
    latest = (await store.list_callbacks())[0]
    assert latest.endpoint_id == third.id and latest.payload["data"]["key"] == "r:3"
