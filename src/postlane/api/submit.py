"""``POST /v1/messages`` made idempotent by key *and* body.

The ``Idempotency-Key`` header is the delivery's idempotency key. The first request creates
the delivery and keeps the SHA-256 of its canonical body with it (in the same transaction);
a later request with that key gets the same delivery if its body hashes the same, and is
refused otherwise: a key reused for a different message is a bug in the caller, and
silently returning the first message would hide it.

A key belongs to its producer (``core.producers``): the delivery records the API key that
wrote it, and a key written by another producer (the application's outbox, an import,
another API key) is refused with 409 (``KeyConflict``), so that no client can capture a
key the application will use, nor another client's.
"""

from __future__ import annotations

from typing import Protocol

from postlane import tracing
from postlane.api.models import MessageIn
from postlane.core.message import Delivery
from postlane.core.producers import api_producer
from postlane.core.records import ApiKey
from postlane.core.validation import check_key
from postlane.errors import PostlaneError, StoreError
from postlane.store.roles import OperatorStore, ProducerStore


class IdempotencyConflict(PostlaneError):
    """This client used the key before for a different request body."""

    def __init__(self, message: str, delivery_id: int) -> None:
        super().__init__(message)
        self.delivery_id = delivery_id


class SubmitStore(ProducerStore, OperatorStore, Protocol):
    """What ``submit`` uses: the HTTP API's idempotent enqueue, and reading the delivery
    back to answer with it."""


async def submit(store: SubmitStore, key: str, body: MessageIn,
                 client: ApiKey) -> tuple[Delivery, bool]:
    """Enqueue ``body`` under ``key`` for ``client``; returns the delivery and whether this
    call created it.

    Raises ``InvalidMessage`` (nothing written), ``KeyConflict`` (the key belongs to another
    producer: the application, an import, another API key) or ``IdempotencyConflict`` (this
    client used the key for another body).
    """
    check_key(key)
    request_hash = body.request_hash()
    message = body.message(key)
    result, stored_hash = await store.enqueue_request(message, request_hash,
                                                      api_producer(client.id))
    tracing.enqueued([message], [result])
    if not result.created and stored_hash != request_hash:
        raise IdempotencyConflict(
            f"Idempotency-Key {key!r} was already used for delivery {result.id} with a "
            "different body; a key names one message: send the same body to get the same "
            "answer, or derive a new key from the new business event", result.id)
    delivery = await store.get(result.id)
    if delivery is None:  # pragma: no cover - pruned between the two statements
        raise StoreError(f"delivery {result.id} vanished right after enqueue")
    return delivery, result.created
