"""The values the store hands back and takes in, and the small policies that go with them.

They are records, not storage: the worker, the API, the CLI and the dashboard read them
without knowing which engine (or whether any database) produced them. The engines in
``postlane.store`` build them from rows; the SQL stays there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from postlane.core.message import Message
from postlane.core.states import State
from postlane.errors import InvalidMessage


# -- the worker's path ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's hold on one delivery: the id plus the claim number the lease guards on."""

    id: int
    claims: int


@dataclass(frozen=True, slots=True)
class Transition:
    """One outcome a worker reports for a delivery it holds.

    Applied only while the delivery is still ``sending`` under the same owner and claim
    number; otherwise it is dropped and the caller learns so from the returned ids.
    """

    id: int
    claims: int
    state: State
    event: str
    """Timeline event kind: ``sent``, ``retry_scheduled``, ``throttled``, ``dead_lettered``..."""
    delay_s: float | None = None
    """For ``pending``: the next attempt is at database-now plus this."""
    spend_attempt: bool = True
    """False for a throttle or a limiter denial: being early is not a failure."""
    error: str | None = None
    provider_message_id: str | None = None
    dead_reason: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Goes into the event; an ``outcome`` key marks it as part of the attempt history."""


@dataclass(frozen=True, slots=True)
class RescueResult:
    """What the rescuer did with expired leases, kept apart as the bulk-import text asks."""

    requeued: list[int]
    """Claimed, attempt never started: safe to send, back to ``pending``."""
    ambiguous: list[int]
    """The attempt had started: the provider may have it; never straight back to pending."""


MAX_RESPONSE_CHARS = 2000
"""Provider responses are kept verbatim up to this bound; some answer with whole HTML pages."""


def bound_response(text: str | None) -> str | None:
    """Keep a provider's response verbatim, but bounded."""
    if text is None or len(text) <= MAX_RESPONSE_CHARS:
        return text
    return text[:MAX_RESPONSE_CHARS] + f"... [{len(text) - MAX_RESPONSE_CHARS} more chars]"


# -- controls shared by the fleet ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Control:
    name: str
    value: dict[str, Any]
    version: int
    updated_at: datetime


# -- reading and operating -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Event:
    id: int
    delivery_id: int
    at: datetime
    kind: str
    state: str | None
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LaneStats:
    depth: int
    """Deliveries not yet done: pending plus sending."""
    oldest_age_s: float
    """Age since enqueue of the oldest of those; 0 when there are none."""


@dataclass(frozen=True, slots=True)
class Stats:
    """The four numbers (less dead-letter arrivals, which are a rate): see the queueing text."""

    lanes: dict[str, LaneStats]
    states: dict[str, int]
    attempts: dict[str, int]
    """Active (pending or sending) deliveries by the attempt they are on: "1" is a first try."""
    dead_letters: dict[str, int]
    """Open (not replayed, not discarded) dead letters by reason."""

    def as_json(self) -> dict[str, Any]:
        return {
            "lanes": {
                name: {"depth": lane.depth, "oldest_age_s": round(lane.oldest_age_s, 3)}
                for name, lane in sorted(self.lanes.items())
            },
            "states": dict(self.states),
            "attempts": dict(self.attempts),
            "dead_letters": dict(self.dead_letters),
        }


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered delivery with everything needed to act on it, kept verbatim."""

    delivery_id: int
    reason: str
    snapshot: dict[str, Any]
    """The delivery as it was meant to be sent: key, recipient, rendered content, versions."""
    last_response: str | None
    attempt_history: list[dict[str, Any]]
    dead_at: datetime
    replayed_at: datetime | None
    replayed_by: str | None
    discarded_at: datetime | None
    discard_reason: str | None
    replay_count: int = 0
    delivery_state: str | None = None
    """The delivery's state now: ``dead`` (or ``expired``) while the entry is open."""


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """A triage selection. By default: open entries (still dead, not discarded)."""

    reason: str | None = None
    lane: str | None = None
    template_id: str | None = None
    import_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    replayed: bool | None = None
    """None: either; False: never replayed (what a bulk replay takes); True: replayed."""
    include_closed: bool = False
    """Also entries discarded or whose delivery is no longer dead (replayed and sent)."""


# -- the on-call view: the messages browser, workers, outcomes over time ---------------------
MESSAGE_STATES: tuple[str, ...] = (
    "pending", "retrying", "sending", "ambiguous", "sent", "dead", "expired", "cancelled",
    "suppressed",
)
"""What the messages browser filters by: the delivery states, with ``pending`` split in two
(``pending``: not attempted yet; ``retrying``: pending again after a failed attempt)."""

QUEUED = "queued"
"""A selection state beside ``MESSAGE_STATES``: pending, attempted or not (what a bulk
cancel takes)."""


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """A selection of deliveries: the messages browser's filters and what a bulk action
    acts on. Every field narrows (exact matches); none set is every delivery."""

    state: str | None = None
    """One of ``MESSAGE_STATES``."""
    lane: str | None = None
    import_id: str | None = None
    template_id: str | None = None
    recipient: str | None = None
    key: str | None = None
    max_id: int | None = None
    """Only ids up to this one: a bulk action confirmed for the deliveries counted then
    does not also take those enqueued since."""

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in (*MESSAGE_STATES, QUEUED):
            raise ValueError(f"unknown state {self.state!r}; one of {', '.join(MESSAGE_STATES)}")

    def with_state(self, state: str) -> MessageFilter:
        """This selection narrowed to ``state`` (a bulk action's own state)."""
        return MessageFilter(state, self.lane, self.import_id, self.template_id,
                             self.recipient, self.key, self.max_id)

    def as_query(self) -> dict[str, str]:
        """The fields that are set, as text (for links and hidden form fields)."""
        return {name: str(value) for name in FILTER_FIELDS
                if (value := getattr(self, name)) is not None}


FILTER_FIELDS: tuple[str, ...] = (
    "state", "lane", "import_id", "template_id", "recipient", "key", "max_id",
)


@dataclass(frozen=True, slots=True)
class DeliverySummary:
    """One line of the messages browser: a delivery without its content."""

    id: int
    key: str
    lane: str
    recipient: str
    subject: str
    state: str
    attempts: int
    claims: int
    created_at: datetime | None
    """None only for a row whose time no reader can hold (a poison row)."""
    updated_at: datetime | None
    template_id: str | None
    import_id: str | None
    dead_reason: str | None

    @property
    def view_state(self) -> str:
        """The state as the browser filters it (``retrying`` apart from ``pending``)."""
        return "retrying" if self.state == "pending" and self.attempts > 0 else self.state


GONE_AFTER_BEATS = 3.0
"""A worker whose last heartbeat is older than this many of its intervals is gone."""


@dataclass(frozen=True, slots=True)
class WorkerHeartbeat:
    """What a running worker writes about itself every few seconds."""

    owner: str
    host: str
    pid: int
    version: str
    provider: str
    lanes: Mapping[str, float]
    """Lane -> share of the worker's send slots."""
    in_flight: int
    interval_s: float


@dataclass(frozen=True, slots=True)
class WorkerSeen:
    """A worker's last heartbeat as read back, with its age on the database clock."""

    heartbeat: WorkerHeartbeat
    started_at: datetime
    heartbeat_at: datetime
    age_s: float

    @property
    def gone(self) -> bool:
        return self.age_s > GONE_AFTER_BEATS * self.heartbeat.interval_s


OUTCOME_SERIES: tuple[str, ...] = ("sent", "throttled", "transient", "ambiguous", "dead")
"""The outcomes counted per minute and lane (dead: dead-letter arrivals, expiry included)."""


@dataclass(frozen=True, slots=True)
class OutcomeMinute:
    minute: int
    """Unix seconds at the start of the minute (database clock)."""
    lane: str
    outcome: str
    count: int


# -- provider events and the suppression list ----------------------------------------------
STATUS_RANK: dict[str, int] = {
    "deferred": 0, "delivered": 1, "opened": 2, "clicked": 2, "bounced": 3, "complained": 4,
}
"""A delivery's provider status only moves up this ladder: a late ``delivered`` after a
``bounced`` is recorded in the timeline but does not change the status."""


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    """A delivery event a provider reported (by webhook), normalised."""

    provider: str
    event_id: str
    kind: str
    """``delivered``, ``bounced`` (hard), ``deferred`` (soft bounce), ``complained``,
    ``opened``, ``clicked``."""
    provider_message_id: str | None
    recipient: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProviderEventResult:
    duplicate: bool
    """The event id was seen before; nothing was done."""
    delivery_id: int | None
    status_changed: bool
    suppressed: str | None = None
    """The address this event put on the suppression list."""


@dataclass(frozen=True, slots=True)
class Suppression:
    address: str
    stream: str
    """The lane it applies to, or ``*`` for every lane."""
    reason: str
    delivery_id: int | None
    created_at: datetime


def suppression_for(event: ProviderEvent, lane: str) -> tuple[str, str] | None:
    """(stream, reason) an event suppresses its address for, if any: a hard bounce for
    every lane (the mailbox does not exist), a complaint for the lane it came through."""
    if event.kind == "bounced":
        return "*", "hard bounce"
    if event.kind == "complained":
        return lane, "complaint"
    return None


# -- templates -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TemplateVersion:
    """One immutable version of a template, and the state of its name."""

    name: str
    version: int
    subject: str
    text: str | None
    html: str | None
    created_at: datetime
    latest_version: int
    deprecated: bool


@dataclass(frozen=True, slots=True)
class TemplateDeletion:
    found: bool
    deleted: bool
    references: int
    """Deliveries that kept it from being deleted (0 when it was deleted)."""


def check_template_id(message: Message, template: str) -> None:
    """A message enqueued as rendered from ``template`` must say so, version included."""
    if message.template_id != template or message.template_version is None:
        raise InvalidMessage(
            f"message {message.key!r} was not rendered from template {template!r} "
            f"(template_id={message.template_id!r}, version={message.template_version!r})",
            field="template_id",
        )


# -- bulk-import runs -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImportProgress:
    """An import run's counters, written in each batch's transaction."""

    import_id: str
    rows_read: int
    rows_enqueued: int
    """Rows handed to the store: created now, or already there from an earlier run."""
    rows_skipped: int


@dataclass(frozen=True, slots=True)
class ImportRecord:
    import_id: str
    template: str
    template_version: int
    file_name: str
    lane: str
    runs: int
    started_at: datetime
    last_started_at: datetime
    finished_at: datetime | None
    rows_read: int
    rows_enqueued: int
    rows_created: int
    """Deliveries the latest run created (a re-run creates none: the keys exist)."""
    rows_skipped: int


@dataclass(frozen=True, slots=True)
class ImportCounts:
    """An import's deliveries by what happened to them."""

    states: dict[str, int]
    """Deliveries by state (every state present, zeros included)."""
    waiting_retry: int
    """Pending after at least one attempt: waiting for another."""
    oldest_waiting_age_s: float
    """Age since enqueue of the oldest delivery still pending (first try or retry)."""

    @property
    def created(self) -> int:
        return sum(self.states.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "claimed": self.states.get("sending", 0),
            "accepted": self.states.get("sent", 0),
            "queued": self.states.get("pending", 0) - self.waiting_retry,
            "waiting_retry": self.waiting_retry,
            "dead": self.states.get("dead", 0),
            "oldest_waiting_age_s": round(self.oldest_waiting_age_s, 3),
            "states": dict(self.states),
        }


def import_counts_from_rows(rows: Sequence[Sequence[Any]]) -> ImportCounts:
    """Build ``ImportCounts`` from rows of (state, retried, count, oldest age in seconds)."""
    states = {str(s): 0 for s in State}
    waiting_retry = 0
    oldest = 0.0
    for state, retried, count, age in rows:
        states[state] = states.get(state, 0) + int(count)
        if state == "pending":
            if retried:
                waiting_retry += int(count)
            oldest = max(oldest, float(age or 0.0))
    return ImportCounts(states, waiting_retry, max(0.0, oldest))


# -- the HTTP API's keys -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ApiKey:
    """An HTTP API key as stored: the SHA-256 of its token, never the token itself."""

    id: int
    name: str
    prefix: str
    """The token's first characters (``pl_AbCd1234``), to tell keys apart in a list."""
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None
    sessions_after: float | None = None
    """Dashboard sessions issued before this (unix seconds) are over: signed out."""

    @property
    def active(self) -> bool:
        return self.revoked_at is None
