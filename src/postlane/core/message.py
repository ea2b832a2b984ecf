"""The two values every part shares: a send intent (``Message``) and its row (``Delivery``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from postlane.core.attachments import Attachment
from postlane.core.fastinit import frozen_init
from postlane.core.states import State
from postlane.core.unsubscribe import ListUnsubscribe

DEFAULT_LANE = "interactive"
EMAIL = "email"


@frozen_init
@dataclass(frozen=True, slots=True)
class Message:
    """A send intent, already rendered: what every attempt and every replay will send.

    ``key`` is the idempotency key, derived from the business event (``reset:<token-id>``),
    never from the recipient or a random value: enqueueing the same key again returns the
    existing delivery.
    """

    key: str
    to: str
    subject: str = ""
    text: str | None = None
    html: str | None = None
    lane: str = DEFAULT_LANE
    sender: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    channel: str = EMAIL
    import_id: str | None = None
    template_id: str | None = None
    template_version: int | None = None
    expires_at: datetime | None = None
    """Absolute end of the message's usefulness, with a time zone, within 0001-01-02 ..
    9999-12-30 UTC (see ``check_time``); at most one of this and ``expires_in``."""
    expires_in: timedelta | None = None
    """Validity window counted from enqueue, on the database clock."""
    delay: timedelta | None = None
    """Do not send before enqueue time plus this."""
    attachments: tuple[Attachment, ...] = ()
    """Files, inline parts (``cid:``) and a calendar invite (``postlane.core.attachments``),
    stored beside the delivery and sent with every attempt and replay."""

    def content_size(self) -> int:
        """Bytes of rendered content, the figure the size limit applies to (attachments
        have limits of their own: ``AttachmentLimits``)."""
        size = (len(self.subject.encode()) + len((self.text or "").encode())
                + len((self.html or "").encode()))
        for name, value in self.headers.items():
            size += len(name.encode()) + 2 + len(value.encode())
        return size


@frozen_init
@dataclass(frozen=True, slots=True)
class Delivery:
    """One row of the delivery table, as a worker or an operator sees it."""

    id: int
    key: str
    lane: str
    channel: str
    recipient: str
    sender: str | None
    subject: str
    text: str | None
    html: str | None
    headers: dict[str, str]
    metadata: dict[str, Any]
    import_id: str | None
    template_id: str | None
    template_version: int | None
    state: State
    attempts: int
    claims: int
    """How many times a worker has claimed it; part of the lease guard."""
    run_at: datetime
    expires_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    attempt_started_at: datetime | None
    provider_message_id: str | None
    dead_reason: str | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    finished_at: datetime | None
    attachments: tuple[Attachment, ...] = field(default=(), kw_only=True)
    """Loaded only when the message is built to send (never by a claim): the worker reads
    them for the deliveries it is about to send (``WorkerStore.attachments_among``)."""
    may_be_suppressed: bool = field(default=True, kw_only=True, compare=False)
    """Set by a claim that could rule it out: False when no suppression names the address
    (as stored, lowered, ASCII only), so the worker's suppression check can skip it. True,
    the default, means "check" (``WorkerStore.suppressed_among`` decides)."""
    has_attachments: bool | None = field(default=None, kw_only=True, compare=False)
    """Set by a claim: whether stored parts exist, so the worker reads them only for those
    that have some. None, the default, means unknown (the worker looks)."""
    unsubscribe: ListUnsubscribe | None = field(default=None, kw_only=True, compare=False)
    """Set by the worker, not stored: the one-click unsubscribe headers this send carries
    (bulk lanes only; ``core.unsubscribe``). Every adapter puts them on the wire."""

    def as_message(self) -> Message:
        """The original intent, for replays: same key, same rendered content."""
        return Message(
            key=self.key,
            to=self.recipient,
            subject=self.subject,
            text=self.text,
            html=self.html,
            lane=self.lane,
            sender=self.sender,
            headers=dict(self.headers),
            metadata=dict(self.metadata),
            channel=self.channel,
            import_id=self.import_id,
            template_id=self.template_id,
            template_version=self.template_version,
            expires_at=self.expires_at,
            attachments=self.attachments,
        )


_ROW_LENGTH = sum(1 for f in fields(Delivery) if not f.kw_only)


def delivery_of_row(values: Sequence[Any], may_be_suppressed: bool = True,
                    has_attachments: bool | None = None) -> Delivery:
    """``Delivery(*values, may_be_suppressed=..., has_attachments=...)`` for a store's row,
    values already decoded, in field order; the other keyword fields get their defaults
    (``attachments`` empty, ``unsubscribe`` None). A claim builds a hundred per batch:
    ``frozen_init`` keeps that cheap."""
    if len(values) != _ROW_LENGTH:
        raise ValueError(f"a delivery row of {len(values)} values, not {_ROW_LENGTH}")
    return Delivery(*values, may_be_suppressed=may_be_suppressed,
                    has_attachments=has_attachments)


@dataclass(frozen=True, slots=True)
class UnreadableDelivery(Delivery):
    """A row the store could not read back into a ``Delivery`` (a time past year 9999, a
    header that is not text...): a poison delivery. The columns that could not be read hold
    placeholders (no time: None, or the epoch; no headers: ``{}``), so it can travel where a
    delivery does without failing the others read with it; the worker dead-letters it
    unsent (``handler_error``), and readers show ``unreadable``."""

    unreadable: str
    """Which columns could not be read and why, each error verbatim."""


@frozen_init
@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What ``enqueue`` returns: the delivery id, and whether this call created it."""

    id: int
    key: str
    created: bool
