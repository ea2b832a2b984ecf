"""Poison deliveries: what the worker claimed but can never send because of its own data.

A claimed row the store could not read back (an ``UnreadableDelivery``) is not sent and not
given back, where the next claim would meet it again: it becomes a dead letter of its own,
``handler_error``, with the store's error verbatim, and the rest of its batch goes on. (A
delivery that fails later, building its MIME message or inside the adapter, becomes the
same dead letter through the send's own ``handler_error`` path.)
"""

from __future__ import annotations

from postlane.core.message import Delivery, UnreadableDelivery
from postlane.core.policy import Decision, handler_error


def unreadable_decision(delivery: Delivery) -> Decision | None:
    """The dead letter for a delivery the store could not read; None for any other."""
    if not isinstance(delivery, UnreadableDelivery):
        return None
    return handler_error(delivery, f"the stored delivery cannot be read: {delivery.unreadable}")
