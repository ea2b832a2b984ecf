"""The API's request and response bodies (pydantic), and their conversions from core values."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from postlane.core.attachments import Attachment
from postlane.core.message import Delivery, Message
from postlane.core.records import FILTER_STATES, DeadLetter, DeliveryFilter, Event, FallbackPair
from postlane.core.validation import json_problem, text_problem
from postlane.dead_letters import ReplayPlan
from postlane.operations import BulkResult, Resolution

FILTER_STATES_LITERAL = tuple(FILTER_STATES)
STATE_HELP = ("A delivery state, or `retrying` (pending after a spent attempt; `pending` is "
              "then a first try still waiting), or `queued` (both).")

MAX_SECONDS = 10 * 365 * 86400.0
"""Longest duration accepted anywhere (ten years): beyond it a date no longer fits."""


def check_text(value: str) -> str:
    """Refuse what no database column can hold (``postlane.core.validation.text_problem``)."""
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def check_json(value: Any) -> Any:
    """Refuse a JSON value the store cannot keep alike on both engines, or nested deeper
    than ``MAX_METADATA_DEPTH``: run before pydantic or the request hash walk into it."""
    problem = json_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def iso_time(value: Any) -> Any:
    """Times are ISO 8601 strings (or datetimes): no unix numbers passing as dates."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("not an ISO 8601 date-time (e.g. 2030-01-31T12:00:00Z)") from None
    if not isinstance(value, datetime):
        raise ValueError("not an ISO 8601 date-time (e.g. 2030-01-31T12:00:00Z)")
    return value


Text = Annotated[str, AfterValidator(check_text)]
IsoTime = Annotated[AwareDatetime, BeforeValidator(iso_time)]
JsonObject = Annotated[dict[str, Any], BeforeValidator(check_json)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- messages ----------------------------------------------------------------------------
def check_base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("content is not base64 (standard alphabet, padded)") from None
    return value


class AttachmentIn(Strict):
    """A file, an inline part (``cid:``) or a calendar invite, its bytes in base64."""

    filename: Text = Field(min_length=1, max_length=255)
    content_type: Text = Field(default="application/octet-stream", max_length=255,
                               description="`type/subtype`, with parameters if any.")
    content: Annotated[str, AfterValidator(check_base64)] = Field(
        description="The bytes, base64 (standard alphabet, padded).")
    kind: Literal["attachment", "inline", "calendar"] = Field(
        default="attachment", description="`inline` parts are named by the HTML as "
        "`cid:<content_id>`; a `calendar` part is a text/calendar invite (METHOD:REQUEST "
        "or METHOD:CANCEL).")
    content_id: Text | None = Field(default=None, max_length=127,
                                    description="For an inline part: the id after `cid:`.")

    def attachment(self) -> Attachment:
        return Attachment(self.filename, base64.b64decode(self.content), self.content_type,
                          self.kind, self.content_id)


class AttachmentOut(BaseModel):
    """A part as an operator sees it: never its bytes (download it by position)."""

    position: int
    filename: str
    content_type: str
    kind: str
    content_id: str | None
    size: int

    @classmethod
    def of(cls, position: int, part: Attachment) -> AttachmentOut:
        return cls(position=position, filename=part.filename, content_type=part.content_type,
                   kind=part.kind, content_id=part.content_id, size=part.size)


class MessageIn(Strict):
    """A send intent, already rendered. The idempotency key comes in the
    ``Idempotency-Key`` header, not in the body."""

    to: Text = Field(min_length=1, max_length=320,
                     description="Recipient: an email address, or an E.164 number for SMS.")
    subject: Text = Field(default="", max_length=998)
    text: Text | None = Field(default=None, description="Plain-text body (text or html, or both).")
    html: Text | None = None
    lane: Text = Field(default="interactive", min_length=1, max_length=100,
                       description="A configured lane: interactive or bulk by default.")
    sender: Text | None = Field(default=None, max_length=320, description="The From address.")
    headers: dict[Text, Text] = Field(
        default_factory=dict,
        description="Extra headers, one line each (no line break of any kind). Not those "
                    "Postlane sets (Message-ID, Content-Type, MIME-Version, "
                    "Content-Transfer-Encoding, X-Postlane-*) or a field owns (To, Cc, Bcc, "
                    "From, Sender, Subject).")
    metadata: JsonObject = Field(default_factory=dict,
                                 description="Yours: kept with the delivery, passed to "
                                             "providers that take metadata. At most 32 "
                                             "levels deep (the object itself is one).")
    channel: Literal["email", "sms"] = "email"
    import_id: Text | None = Field(default=None, min_length=1, max_length=200)
    expires_at: IsoTime | None = Field(
        default=None, description="The end of the message's usefulness (with a time zone); no "
                          "attempt is made after it. At most one of expires_at, expires_in_s.")
    expires_in_s: Seconds | None = Field(
        default=None, description="Validity window in seconds, counted from enqueue.")
    delay_s: Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)] | None = Field(
        default=None, description="Do not send before enqueue time plus this many seconds.")
    attachments: list[AttachmentIn] = Field(
        default_factory=list, description="Files, inline parts and a calendar invite, "
        "stored with the message and sent with every attempt. Limits per part and per "
        "message apply (10 MB each by default; 413-sized bodies are refused before).")

    def request_hash(self) -> str:
        """SHA-256 of the canonical body: defaults filled in, keys sorted, no whitespace."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True,
                               separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def message(self, key: str) -> Message:
        return Message(
            key=key, to=self.to, subject=self.subject, text=self.text, html=self.html,
            lane=self.lane, sender=self.sender, headers=dict(self.headers),
            metadata=dict(self.metadata), channel=self.channel, import_id=self.import_id,
            expires_at=self.expires_at,
            expires_in=timedelta(seconds=self.expires_in_s) if self.expires_in_s else None,
            delay=timedelta(seconds=self.delay_s) if self.delay_s else None,
            attachments=tuple(a.attachment() for a in self.attachments),
        )


class MessageLinks(BaseModel):
    self_: str = Field(serialization_alias="self", description="This message, with its "
                                                               "timeline.")


class MessageAccepted(BaseModel):
    """The answer to ``POST /v1/messages``: only what never changes, so that repeating the
    request returns exactly this again."""

    id: int
    key: str = Field(description="The idempotency key (the request's Idempotency-Key).")
    lane: str
    channel: str
    created_at: datetime
    links: MessageLinks

    @classmethod
    def of(cls, delivery: Delivery) -> MessageAccepted:
        return cls(id=delivery.id, key=delivery.key, lane=delivery.lane,
                   channel=delivery.channel, created_at=delivery.created_at,
                   links=MessageLinks(self_=f"/v1/messages/{delivery.id}"))


class MessageOut(BaseModel):
    """A delivery as it is now."""

    id: int
    key: str
    state: str
    lane: str
    channel: str
    to: str
    sender: str | None
    subject: str
    attempts: int
    run_at: datetime
    expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    finished_at: datetime | None
    provider_message_id: str | None
    dead_reason: str | None
    last_error: str | None
    import_id: str | None
    template_id: str | None
    template_version: int | None
    headers: dict[str, str]
    metadata: dict[str, Any]

    @classmethod
    def of(cls, d: Delivery) -> MessageOut:
        return cls(
            id=d.id, key=d.key, state=str(d.state), lane=d.lane, channel=d.channel,
            to=d.recipient, sender=d.sender, subject=d.subject, attempts=d.attempts,
            run_at=d.run_at, expires_at=d.expires_at, created_at=d.created_at,
            updated_at=d.updated_at, sent_at=d.sent_at, finished_at=d.finished_at,
            provider_message_id=d.provider_message_id, dead_reason=d.dead_reason,
            last_error=d.last_error, import_id=d.import_id, template_id=d.template_id,
            template_version=d.template_version, headers=dict(d.headers),
            metadata=dict(d.metadata),
        )


class EventOut(BaseModel):
    """One transition of a delivery."""

    at: datetime
    kind: str = Field(description="enqueued, claimed, sent, retry_scheduled, throttled, "
                                  "dead_lettered, replayed, delivered, bounced, ...")
    state: str | None
    data: dict[str, Any]

    @classmethod
    def of(cls, e: Event) -> EventOut:
        return cls(at=e.at, kind=e.kind, state=e.state, data=dict(e.data))


class FallbackOut(BaseModel):
    """An email and the SMS delivery created as its fallback (docs/sms.md)."""

    email_id: int
    sms_id: int | None = Field(description="None: the email met a trigger its policy does "
                                           "not fall back on; no SMS was made.")
    reason: str = Field(description="dead, expired or unsent.")
    created_at: datetime

    @classmethod
    def of(cls, pair: FallbackPair) -> FallbackOut:
        return cls(email_id=pair.email_id, sms_id=pair.sms_id, reason=pair.reason,
                   created_at=pair.created_at)


class MessageDetail(BaseModel):
    message: MessageOut
    timeline: list[EventOut]
    attachments: list[AttachmentOut] = Field(
        default_factory=list, description="Names, types and sizes of the stored parts; "
        "`GET /v1/messages/{id}/attachments/{position}` downloads one.")
    fallback: FallbackOut | None = Field(
        default=None, description="The SMS fallback pair this message belongs to (as the "
                                  "email or as the SMS), if any.")


class MessageList(BaseModel):
    messages: list[MessageOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page (older messages); "
                                  "null on the last page.")


# -- acting on messages ------------------------------------------------------------------
StateName = Literal[FILTER_STATES_LITERAL]  # type: ignore[valid-type]


class CancelIn(Strict):
    reason: Text = Field(default="", max_length=1000,
                         description="Why, for the timeline (who is recorded anyway).")


class ResolveIn(Strict):
    resolution: Resolution = Field(description="`sent`: the provider has it (you checked); "
                                               "`resend`: send it again with the same key "
                                               "(a duplicate is possible); `dead`: give up "
                                               "(dead letter `ambiguous_unresolved`).")
    note: Text = Field(default="", max_length=1000, description="For the timeline.")
    provider_message_id: Text | None = Field(
        default=None, max_length=500, description="With `sent`: the provider's id, if known.")


class ActedOut(BaseModel):
    id: int
    state: str = Field(description="The delivery's state now.")


class FilterIn(Strict):
    """A selection of messages, as `GET /v1/messages` takes it."""

    state: StateName | None = Field(default=None, description=STATE_HELP)
    lane: Text | None = Field(default=None, min_length=1, max_length=100)
    key: Text | None = Field(default=None, min_length=1, max_length=255)
    recipient: Text | None = Field(default=None, min_length=1, max_length=320)
    import_id: Text | None = Field(default=None, min_length=1, max_length=200)
    template_id: Text | None = Field(default=None, min_length=1, max_length=200)

    def selection(self) -> DeliveryFilter:
        return DeliveryFilter(state=self.state, lane=self.lane, key=self.key,
                              recipient=self.recipient, import_id=self.import_id,
                              template_id=self.template_id)


class BulkIn(FilterIn):
    dry_run: bool = Field(default=False, strict=True,
                          description="Count the selection; change nothing.")
    expected: int | None = Field(
        default=None, ge=0, strict=True,
        description="The dry run's `matched`: required to act; refused (409) if the "
                    "selection has grown past it.")
    upto_id: int | None = Field(
        default=None, ge=0, strict=True,
        description="The dry run's `upto_id`: required to act; nothing newer than it is "
                    "touched.")


class BulkCancelIn(BulkIn):
    reason: Text = Field(default="", max_length=1000, description="Why, for the timeline.")


class BulkResolveIn(BulkIn):
    resolution: Resolution
    note: Text = Field(default="", max_length=1000, description="For the timeline.")


class BulkOut(BaseModel):
    selection: dict[str, str] = Field(description="The selection acted on (its state "
                                                  "narrowed to what the action applies to).")
    matched: int = Field(description="Messages in the selection when it was counted.")
    upto_id: int = Field(description="The highest id counted; 0 when none matched.")
    acted: int = Field(description="Cancelled or resolved now (0 on a dry run); fewer than "
                                   "`matched` when some left the selection meanwhile.")
    dry_run: bool

    @classmethod
    def of(cls, result: BulkResult) -> BulkOut:
        return cls(selection=result.selection.as_dict(), matched=result.matched,
                   upto_id=result.upto_id, acted=result.acted, dry_run=result.dry_run)


# -- dead letters ------------------------------------------------------------------------
class DeadLetterOut(BaseModel):
    delivery_id: int
    reason: str
    cause: str | None = Field(default=None, description=(
        "What to fix, and so whom to wake: `unknown_template`, `account_or_configuration`, "
        "`handler_error`, `ambiguous_unresolved` (page); `rejected_recipient`, "
        "`rejected_content`, `rejected_other`, `budget_exhausted`, `expired` (ticket)."))
    key: str | None
    lane: str | None
    to: str | None
    template_id: str | None
    import_id: str | None
    dead_at: datetime
    last_response: str | None
    replay_count: int
    replayed_at: datetime | None
    state: str | None = Field(description="The delivery's state now (dead or expired while "
                                          "the entry is open).")
    discarded_at: datetime | None

    @classmethod
    def of(cls, e: DeadLetter) -> DeadLetterOut:
        s = e.snapshot
        return cls(
            delivery_id=e.delivery_id, reason=e.reason, cause=e.cause,
            key=_opt_str(s.get("idempotency_key")),
            lane=_opt_str(s.get("lane")), to=_opt_str(s.get("recipient")),
            template_id=_opt_str(s.get("template_id")), import_id=_opt_str(s.get("import_id")),
            dead_at=e.dead_at, last_response=e.last_response, replay_count=e.replay_count,
            replayed_at=e.replayed_at, state=e.delivery_state, discarded_at=e.discarded_at,
        )


class DeadLetterDetail(DeadLetterOut):
    snapshot: dict[str, Any] = Field(description="The delivery as it was meant to be sent.")
    attempt_history: list[dict[str, Any]]
    replayed_by: str | None
    discard_reason: str | None
    attachments: list[AttachmentOut] = Field(
        default_factory=list, description="The parts kept with the delivery (a replay sends "
        "them again); `GET /v1/messages/{id}/attachments/{position}` downloads one.")

    @classmethod
    def of(cls, e: DeadLetter) -> DeadLetterDetail:
        return cls(**DeadLetterOut.of(e).model_dump(), snapshot=dict(e.snapshot),
                   attempt_history=list(e.attempt_history), replayed_by=e.replayed_by,
                   discard_reason=e.discard_reason)


class DeadLetterList(BaseModel):
    dead_letters: list[DeadLetterOut] = Field(description="Oldest first.")
    by_reason: dict[str, int] = Field(description="Counts of the entries listed, by reason.")


class ReplayOneIn(Strict):
    valid_for_s: Seconds | None = Field(
        default=None, description="Refuse if the delivery was created longer ago than this.")
    dry_run: bool = False


class ReplayOneOut(BaseModel):
    delivery_id: int
    key: str | None = Field(description="The original idempotency key, kept.")
    replayed: bool = Field(description="False on a dry run.")
    next: str


class SelectionIn(Strict):
    """A triage selection: the entries of the dead-letter list with these filters."""

    reason: Text | None = None
    cause: Text | None = None
    lane: Text | None = None
    template_id: Text | None = None
    import_id: Text | None = None
    since: IsoTime | None = None
    until: IsoTime | None = None


class ReplaySelectionIn(SelectionIn):
    valid_for_s: Seconds | None = Field(
        default=None, description="Skip entries whose delivery was created longer ago than this.")
    dry_run: bool = False
    limit: int = Field(default=1000, ge=1, le=10_000)


class ReplayPlanOut(BaseModel):
    canary: int | None = Field(description="The entry of the selection that was replayed "
                                           "first and sent.")
    replayed: list[int] = Field(description="Replayed now (on a dry run: would be).")
    skipped_expired: list[int] = Field(description="No longer useful: discard them.")
    dry_run: bool

    @classmethod
    def of(cls, plan: ReplayPlan) -> ReplayPlanOut:
        return cls(canary=plan.canary, replayed=list(plan.replay),
                   skipped_expired=list(plan.skipped_expired), dry_run=plan.dry_run)


class DiscardIn(Strict):
    reason: Text = Field(min_length=1, max_length=1000, description="Why it is not replayed.")


class DiscardOut(BaseModel):
    delivery_id: int
    discarded: bool
    reason: str


# -- operating ---------------------------------------------------------------------------
class LaneControlOut(BaseModel):
    lane: str
    paused: bool


class LaneStatusOut(BaseModel):
    depth: int
    oldest_age_s: float


class StatusOut(BaseModel):
    """The same object as ``postlane status --json``."""

    lanes: dict[str, LaneStatusOut]
    states: dict[str, int]
    attempts: dict[str, int] = Field(description="Active deliveries by the attempt they are on.")
    dead_letters: dict[str, int] = Field(description="Open dead letters by reason.")
    dead_letter_causes: dict[str, int] = Field(
        default_factory=dict, description="Open dead letters by cause (what to fix: "
                                          "`unknown_template`, `rejected_recipient`, ...).")
    arrivals: dict[str, int] = Field(
        default_factory=dict, description="Messages ever queued, per lane (kept + pruned).")
    paused_lanes: list[str]
    paused_imports: list[str]
    breakers: dict[str, dict[str, Any]]
    deliverability: dict[str, Any] = Field(
        default_factory=dict,
        description="Per lane over `window_s`: sent, bounced, soft_bounced, complained, "
                    "unsubscribed, bounce_rate and complaint_rate (docs/deliverability.md).")
    pending_by_channel: dict[str, int] = Field(
        default_factory=dict, description="Pending deliveries by channel (email, sms): each "
                                          "channel needs a worker of its own.")
    sms_fallbacks: dict[str, int] = Field(
        default_factory=dict, description="SMS fallbacks created, by trigger (dead, expired, "
                                          "unsent; no_sms: decided, none sent).")


class WebhookOut(BaseModel):
    status: int
    detail: str
    events: list[dict[str, Any]] = Field(default_factory=list)


class Health(BaseModel):
    status: Literal["ok"]


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def selection_kwargs(selection: SelectionIn) -> dict[str, Any]:
    return {"reason": selection.reason, "cause": selection.cause, "lane": selection.lane,
            "template_id": selection.template_id, "import_id": selection.import_id,
            "since": selection.since, "until": selection.until}
