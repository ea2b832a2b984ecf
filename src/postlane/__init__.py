"""Postlane: a durable send pipeline for transactional email.

The public API is exactly ``__all__``; everything else is internal and may move.
"""

from __future__ import annotations

from postlane.core.attachments import Attachment, AttachmentLimits, calendar_invite, inline
from postlane.core.message import Delivery, EnqueueResult, Message
from postlane.core.states import DeadReason, State
from postlane.core.validation import Limits
from postlane.errors import (
    ConfigurationError,
    ContentTooLarge,
    InvalidAddress,
    InvalidAttachment,
    InvalidHeader,
    InvalidKey,
    InvalidMessage,
    InvalidMetadata,
    InvalidText,
    InvalidTime,
    KeyConflict,
    MigrationRequired,
    MissingExtra,
    PostlaneError,
    StoreConflict,
    StoreError,
    StoreUnavailable,
    UnknownLane,
    UnsupportedConnection,
)
from postlane.outbox import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from postlane.store import Store, open_store

__version__ = "0.1.0"

__all__ = [
    "Attachment",
    "AttachmentLimits",
    "ConfigurationError",
    "ContentTooLarge",
    "DeadReason",
    "Delivery",
    "EnqueueResult",
    "InvalidAddress",
    "InvalidAttachment",
    "InvalidHeader",
    "InvalidKey",
    "InvalidMessage",
    "InvalidMetadata",
    "InvalidText",
    "InvalidTime",
    "KeyConflict",
    "Limits",
    "Message",
    "MigrationRequired",
    "MissingExtra",
    "PostlaneError",
    "State",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreUnavailable",
    "UnknownLane",
    "UnsupportedConnection",
    "__version__",
    "calendar_invite",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "inline",
    "open_store",
]
