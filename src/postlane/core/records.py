"""The values the store hands back and takes in, and the small policies that go with them.

They are records, not storage: the worker, the API, the CLI and the dashboard read them
without knowing which engine (or whether any database) produced them. The engines in
``postlane.store`` build them from rows; the SQL stays there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from postlane.core.causes import cause_of
from postlane.core.fastinit import frozen_init
from postlane.core.message import Delivery, Message
from postlane.core.states import State
from postlane.errors import InvalidMessage, TemplateDeprecated, UnknownTemplate


# -- the worker's path ---------------------------------------------------------------------
@frozen_init
@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's hold on one delivery: the id plus the claim number the lease guards on."""

    id: int
    claims: int


@frozen_init
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

    @property
    def dead_cause(self) -> str | None:
        """The cause its dead-letter entry keeps (``core.causes``); None unless it ends in
        ``dead`` or ``expired``."""
        if self.state not in (State.DEAD, State.EXPIRED):
            return None
        cause = self.detail.get("cause")
        return str(cause_of(self.dead_reason or str(self.state), self.error,
                            cause if isinstance(cause, str) else None))


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
    dead_letter_causes: dict[str, int] = field(default_factory=dict)
    """The same, by cause (``core.causes``)."""
    arrivals: dict[str, int] = field(default_factory=dict)
    """Deliveries ever enqueued, per lane: those kept plus those retention pruned (a
    counter: its rate is the arrival rate)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "lanes": {
                name: {"depth": lane.depth, "oldest_age_s": round(lane.oldest_age_s, 3)}
                for name, lane in sorted(self.lanes.items())
            },
            "states": dict(self.states),
            "attempts": dict(self.attempts),
            "dead_letters": dict(self.dead_letters),
            "dead_letter_causes": dict(self.dead_letter_causes),
            "arrivals": dict(sorted(self.arrivals.items())),
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
    cause: str | None = None
    """What an operator must fix, finely enough to route the alert (``core.causes``);
    None for entries written before migration 0012 that it could not name."""


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """A triage selection. By default: open entries (still dead, not discarded)."""

    reason: str | None = None
    lane: str | None = None
    template_id: str | None = None
    import_id: str | None = None
    cause: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    replayed: bool | None = None
    """None: either; False: never replayed (what a bulk replay takes); True: replayed."""
    include_closed: bool = False
    """Also entries discarded or whose delivery is no longer dead (replayed and sent)."""


@dataclass(frozen=True, slots=True)
class DeliveryFilter:
    """A selection of deliveries: what the messages browser and ``GET /v1/messages`` list,
    and what a bulk cancel, resolve, discard or replay acts on (``postlane.operations``).
    Every field narrows (exact matches); none given selects every delivery kept.

    ``state`` is a delivery state or one of two views of ``pending``: ``retrying`` (a
    pending delivery that has spent an attempt; ``pending`` then means a first try still
    waiting) and ``queued`` (both: every pending delivery)."""

    state: str | None = None
    lane: str | None = None
    key: str | None = None
    recipient: str | None = None
    import_id: str | None = None
    template_id: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in FILTER_STATES:
            raise ValueError(
                f"unknown state {self.state!r}; one of: {', '.join(FILTER_STATES)}")

    def as_dict(self) -> dict[str, str]:
        """The fields that narrow, for echoing a selection back."""
        return {name: value for name in self.__slots__
                if (value := getattr(self, name)) is not None}


FILTER_STATES: tuple[str, ...] = ("queued", "pending", "retrying", *(
    str(s) for s in State if s is not State.PENDING))
"""What ``DeliveryFilter.state`` takes: the states, pending split in two, and both."""


def view_state(delivery: Delivery) -> str:
    """A delivery's state as a selection names it (``retrying`` apart from ``pending``)."""
    if delivery.state is State.PENDING and delivery.attempts > 0:
        return "retrying"
    return str(delivery.state)


# -- the on-call view: workers and outcomes over time --------------------------------------
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
    "deferred": 0, "soft_bounced": 1, "delivered": 2, "opened": 3, "clicked": 3,
    "unsubscribed": 4, "rejected": 5, "bounced": 5, "complained": 6,
}
"""A delivery's provider status only moves up this ladder: a late ``delivered`` after a
``bounced`` is recorded in the timeline but does not change the status."""

EVENT_KINDS = frozenset(STATUS_RANK)
"""The normalised event model every provider's events are mapped to (docs/deliverability.md):
``delivered``; ``bounced`` (hard: the address does not exist or refuses for good);
``soft_bounced`` (the message came back for a reason that may pass: a full mailbox, a
temporary refusal past the relay's retries); ``deferred`` (still being retried by the
relay, not a bounce); ``complained`` (marked as spam); ``rejected`` (the provider refused to
send it: a virus, a blocked address, a suppression of its own); ``unsubscribed`` (the
recipient asked for no more mail of this stream); ``opened``, ``clicked``."""


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    """A delivery event a provider reported (by webhook, DSN or one-click unsubscribe),
    normalised to one of ``EVENT_KINDS``.

    The delivery it concerns is found by ``delivery_id`` when given (the unsubscribe token
    carries it), else by ``provider_message_id``, else by ``idempotency_key`` (a bounce
    that quotes the ``X-Postlane-Key`` header of the message it returns)."""

    provider: str
    event_id: str
    kind: str
    provider_message_id: str | None
    recipient: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    delivery_id: int | None = None
    idempotency_key: str | None = None
    lane: str | None = None
    """The stream the event concerns when the event itself says so (an unsubscribe token);
    otherwise the lane of the delivery it is attached to. An event found for no delivery
    and naming no lane only goes into the event log."""


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
    """The lane it applies to, or ``*`` for every lane (its scope)."""
    reason: str
    delivery_id: int | None
    created_at: datetime
    source_event: str | None = None
    """``provider:event_id`` of the event that made it (None: added by an operator)."""
    expires_at: datetime | None = None
    """When it stops applying (None: until removed). Repeated soft bounces suppress for a
    while; hard bounces, complaints and unsubscribes until removed."""

    def active(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


@dataclass(frozen=True, slots=True)
class LaneDeliverability:
    """What came back for one lane's mail over a window: the figures providers judge a
    sender by (bounces above about 5 %, complaints above about 0.1 % get accounts paused)."""

    sent: int
    """Deliveries of the lane accepted by the provider within the window."""
    events: dict[str, int]
    """Provider events of the lane received within the window, by kind."""

    @property
    def bounce_rate(self) -> float:
        return self.events.get("bounced", 0) / self.sent if self.sent else 0.0

    @property
    def complaint_rate(self) -> float:
        return self.events.get("complained", 0) / self.sent if self.sent else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"sent": self.sent, "bounced": self.events.get("bounced", 0),
                "soft_bounced": self.events.get("soft_bounced", 0),
                "complained": self.events.get("complained", 0),
                "unsubscribed": self.events.get("unsubscribed", 0),
                "bounce_rate": round(self.bounce_rate, 5),
                "complaint_rate": round(self.complaint_rate, 5)}


def deliverability_from_rows(
    lanes: Iterable[str], sent: Mapping[str, int], events: Sequence[Sequence[Any]],
) -> dict[str, LaneDeliverability]:
    """Per lane (every configured one, and any other seen): sent count and events by kind,
    from rows of (lane, kind, count)."""
    result = {name: LaneDeliverability(int(sent.get(name, 0)), {}) for name in lanes}
    for name, count in sent.items():
        result.setdefault(name, LaneDeliverability(int(count), {}))
    for name, kind, count in events:
        result.setdefault(str(name), LaneDeliverability(0, {})).events[str(kind)] = int(count)
    return result


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


def refuse_unusable_template(name: str, version: int | None, deprecated: bool | None) -> None:
    """Refuse new enqueues from a template that does not exist (``deprecated`` is None) or
    is deprecated: one text for every caller (the API, the import, both engines' locked
    check)."""
    if deprecated is None:
        which = f"{name!r} version {version}" if version is not None else repr(name)
        raise UnknownTemplate(f"unknown template {which}", field="template_id")
    if deprecated:
        raise TemplateDeprecated(
            f"template {name!r} is deprecated: it takes no new enqueues (messages already "
            "queued from it still send)", field="template_id")


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


@dataclass(frozen=True, slots=True)
class FallbackPair:
    """An email and the SMS delivery created as its fallback (``core.fallback``)."""

    email_id: int
    sms_id: int | None
    """None: the email met a trigger its policy does not fall back on; no SMS was made."""
    reason: str
    """The trigger: ``dead``, ``expired`` or ``unsent``."""
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ImportCanary:
    """An import's canary (``core.canary``): its first deliveries, sent before the rest."""

    import_id: str
    size: int
    keys: tuple[str, ...]
    """The canary deliveries' keys (the first ``size`` valid rows of the file)."""
    state: str
    """``waiting``, ``passed``, ``failed`` (the import is paused) or ``released`` (an
    operator let the rest go)."""
    reason: str | None
    created_at: datetime
    settled_at: datetime | None
    states: dict[str, int]
    """The canary deliveries by state."""
    first_failure: str | None = None
    """The first canary delivery that died: its key, reason and last response."""
    held: int = 0
    """The import's deliveries still held behind the canary."""

    def as_json(self) -> dict[str, Any]:
        return {"size": self.size, "state": self.state, "reason": self.reason,
                "deliveries": dict(self.states), "held": self.held,
                "settled_at": self.settled_at.isoformat() if self.settled_at else None}


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """Ready work by channel (a channel without a worker of its own only grows) and the SMS
    fallbacks created so far by trigger (``no_sms``: decided, none sent)."""

    pending: dict[str, int]
    fallbacks: dict[str, int]
    sending: dict[str, int] = field(default_factory=dict)
    """Leased (in flight) by channel, read in the same statement as ``pending``."""

    def as_json(self) -> dict[str, Any]:
        return {"pending_by_channel": dict(self.pending), "sms_fallbacks": dict(self.fallbacks)}
# -- provider failover ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Route:
    """Which provider (its account) an attempt of a delivery went to: reconciliation of an
    ambiguous attempt must ask that provider, and a delivery ``pinned`` there (ambiguous,
    settled by the provider's deduplication) is never sent anywhere else."""

    delivery_id: int
    provider: str
    attempt: int
    pinned: bool = False


# -- status callbacks ----------------------------------------------------------------------
CALLBACK_TYPES = ("delivery.sent", "delivery.dead_lettered", "delivery.bounced",
                  "delivery.complained", "delivery.suppressed")
"""The event types an application may subscribe to."""


@dataclass(frozen=True, slots=True)
class CallbackEndpoint:
    """Where the application receives status callbacks. ``api_key_id`` None: for every
    delivery; else only for the deliveries that API key produced."""

    id: int
    url: str
    api_key_id: int | None
    events: tuple[str, ...]
    """Subscribed event types; empty: all of them."""
    created_at: datetime
    disabled_at: datetime | None
    secret: str = field(default="", repr=False)
    """The signing secret (``whsec_...``); never logged."""

    @property
    def active(self) -> bool:
        return self.disabled_at is None


@dataclass(frozen=True, slots=True)
class Callback:
    """One status callback to one endpoint, as its outbox row holds it."""

    id: int
    endpoint_id: int
    event_id: int
    delivery_id: int
    type: str
    payload: Mapping[str, Any]
    state: str
    """``pending``, ``sent`` or ``dead``."""
    attempts: int
    """Attempts made, the one now claimed included."""
    last_error: str | None
    created_at: datetime
    url: str = ""
    secret: str = field(default="", repr=False)

    @property
    def message_id(self) -> str:
        """The Standard Webhooks ``webhook-id``: the same on every retry and replay."""
        return f"evt_{self.event_id}"


@dataclass(frozen=True, slots=True)
class CallbackResult:
    """What came of one claimed callback: ``sent``, ``retry`` (after ``delay_s``) or
    ``dead`` (its budget is spent). Applied only if ``attempts`` still matches the row."""

    id: int
    attempts: int
    outcome: str
    delay_s: float = 0.0
    error: str | None = None
