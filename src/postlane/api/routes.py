"""``/v1``: messages, dead letters, lanes, status, webhooks.

Each route is a few lines over a core function (``submit``, ``operations.cancel``,
``operations.resolve`` and their ``_matching`` forms, ``replay_one``, ``replay_selection``,
``pause_lane``, ``fleet_status``, ``webhooks.receive``); the rules
live there, so the API, the dashboard and the CLI cannot disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response

from postlane import operations
from postlane.api.cursors import decode_cursor, encode_cursor
from postlane.api.downloads import attachment_response, stored_part
from postlane.api.models import (
    STATE_HELP,
    ActedOut,
    AttachmentOut,
    BulkCancelIn,
    BulkOut,
    BulkResolveIn,
    CancelIn,
    DeadLetterDetail,
    DeadLetterList,
    DeadLetterOut,
    DiscardIn,
    DiscardOut,
    EventOut,
    FallbackOut,
    FilterIn,
    IsoTime,
    LaneControlOut,
    MessageAccepted,
    MessageDetail,
    MessageIn,
    MessageList,
    MessageOut,
    ReplayOneIn,
    ReplayOneOut,
    ReplayPlanOut,
    ReplaySelectionIn,
    ResolveIn,
    StateName,
    StatusOut,
    Text,
    WebhookOut,
    selection_kwargs,
)
from postlane.api.problems import FieldError, ProblemError, not_found, problem_responses
from postlane.api.state import AppState, actor, app_state, get_store, require
from postlane.api.submit import IdempotencyConflict, submit
from postlane.core.records import ApiKey, DeadLetterFilter
from postlane.dead_letters import replay_one, replay_selection
from postlane.errors import KeyConflict
from postlane.metrics import fleet_status
from postlane.operations import BulkResult, ConfirmationRequired, OperationRefused
from postlane.store.base import Store
from postlane.worker.controls import pause_lane, resume_lane


async def known_query_only(request: Request) -> None:
    """Refuse query parameters the route does not declare (a typo is not silently ignored)."""
    if not request.query_params:
        return
    dependant = getattr(request.scope.get("route"), "dependant", None)
    known = {param.alias for param in getattr(dependant, "query_params", [])}
    unknown = sorted(set(request.query_params.keys()) - known)
    if unknown:
        raise ProblemError(
            422, "invalid-request", "Invalid request",
            f"unknown query parameter {unknown[0]!r}"
            + (f" (accepted: {', '.join(sorted(known))})" if known else ""),
            errors=[FieldError(location=f"query.{name}", message="unknown query parameter")
                    for name in unknown])


router = APIRouter(prefix="/v1", dependencies=[Depends(known_query_only)])

MAX_ID = 2**63 - 1
DeliveryId = Annotated[int, Path(ge=1, le=MAX_ID, description="The delivery's id.")]
StoreDep = Annotated[Store, Depends(get_store)]
Sender = Annotated[ApiKey, Depends(require("send"))]
Reader = Annotated[ApiKey, Depends(require("read"))]
Operator = Annotated[ApiKey, Depends(require("operate"))]

READ_ERRORS = problem_responses(401, 403, 422, 503)
OPERATE_ERRORS = problem_responses(401, 403, 404, 409, 413, 422, 503)


# -- messages ----------------------------------------------------------------------------
@router.post(
    "/messages", status_code=201, response_model=MessageAccepted, tags=["messages"],
    summary="Queue a message (idempotent)",
    responses={
        201: {"description": "Queued (or, for a repeat of the same request, the original "
                             "answer again, with `Idempotent-Replayed: true`).",
              "headers": {
                  "Location": {"description": "The message.", "schema": {"type": "string"}},
                  "Idempotent-Replayed": {"description": "`true` when this answers a repeat.",
                                          "schema": {"type": "string"}}}},
        **problem_responses(400, 401, 403, 409, 413, 422, 503),
    },
)
async def post_message(
    body: MessageIn,
    response: Response,
    store: StoreDep,
    client: Sender,
    idempotency_key: Annotated[str, Header(
        alias="Idempotency-Key", min_length=1, max_length=255,
        pattern=r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$",
        description="Required. The delivery's idempotency key, derived from the business "
                    "event (`reset:<token-id>`). The same key with the same body returns "
                    "the original answer; with a different body it is refused (422). "
                    "A key written by another producer (the application, an import, "
                    "another API key) is refused (409). "
                    "Without it the request is refused (400).")],
) -> MessageAccepted:
    """Durable when this returns. Scope: `send`."""
    try:
        delivery, created = await submit(store, idempotency_key, body, client)
    except IdempotencyConflict as exc:
        raise ProblemError(422, "idempotency-key-reused", "Idempotency-Key reused",
                           str(exc), field="Idempotency-Key") from None
    except KeyConflict as exc:
        raise ProblemError(409, "key-conflict", "Key conflict", str(exc),
                           field="Idempotency-Key") from None
    response.headers["Location"] = f"/v1/messages/{delivery.id}"
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return MessageAccepted.of(delivery)


@router.get("/messages/{delivery_id:int}", response_model=MessageDetail, tags=["messages"],
            summary="A message and its timeline", responses=problem_responses(401, 403, 404,
                                                                              422, 503))
async def get_message(delivery_id: DeliveryId, store: StoreDep, _key: Reader) -> MessageDetail:
    """Every transition from enqueue to the last provider event. Scope: `read`."""
    delivery = await store.get(delivery_id)
    if delivery is None:
        raise not_found(f"no message with id {delivery_id}")
    events = await store.timeline(delivery.id)
    parts = (await store.attachments_among([delivery.id])).get(delivery.id, ())
    pair = await store.sms_fallback_pair(delivery.id)
    return MessageDetail(message=MessageOut.of(delivery),
                         timeline=[EventOut.of(e) for e in events],
                         attachments=[AttachmentOut.of(i, p) for i, p in enumerate(parts)],
                         fallback=FallbackOut.of(pair) if pair is not None else None)


@router.get("/messages/{delivery_id:int}/attachments/{position:int}", tags=["messages"],
            summary="Download one stored attachment", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}},
                             "description": "The part's bytes, as stored and sent."},
                       **problem_responses(401, 403, 404, 422, 503)})
async def get_attachment(delivery_id: DeliveryId, position: int, store: StoreDep,
                         _key: Reader) -> Response:
    """The bytes exactly as every attempt sends them. Scope: `read`."""
    part = await stored_part(store, delivery_id, position)
    return attachment_response(part)


@router.get("/messages", response_model=MessageList, tags=["messages"],
            summary="List messages: by state, lane, key, recipient, import, template",
            responses=READ_ERRORS)
async def list_messages(
    store: StoreDep, _key: Reader,
    state: Annotated[StateName | None, Query(description=STATE_HELP)] = None,
    lane: Annotated[Text | None, Query(min_length=1, max_length=100)] = None,
    key: Annotated[Text | None, Query(min_length=1, max_length=255,
                                      description="Idempotency key.")] = None,
    recipient: Annotated[Text | None, Query(min_length=1, max_length=320)] = None,
    import_id: Annotated[Text | None, Query(min_length=1, max_length=200)] = None,
    template_id: Annotated[Text | None, Query(min_length=1, max_length=200)] = None,
    cursor: Annotated[str | None, Query(max_length=200, description=(
        "`next_cursor` of the previous page."))] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> MessageList:
    """Newest first, a page at a time (keyset pagination: a page costs the same at any
    depth, and messages queued meanwhile never shift it). Every filter narrows; none lists
    every message kept. Scope: `read`."""
    selection = FilterIn(state=state, lane=lane, key=key, recipient=recipient,
                         import_id=import_id, template_id=template_id).selection()
    page = await store.list_deliveries(selection, before=decode_cursor(cursor),
                                       limit=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return MessageList(messages=[MessageOut.of(d) for d in page],
                       next_cursor=encode_cursor(page[-1].id) if more else None)


@router.post("/messages/{delivery_id:int}/cancel", response_model=ActedOut,
             tags=["messages"], summary="Cancel one queued message",
             responses=OPERATE_ERRORS)
async def cancel_message(delivery_id: DeliveryId, store: StoreDep, key: Operator,
                         body: Annotated[CancelIn | None, Body()] = None) -> ActedOut:
    """A pending (or ambiguous) message is withdrawn; nothing is sent. Refused (409) once it
    is being sent or settled. Scope: `operate`."""
    body = body or CancelIn()
    try:
        await operations.cancel(store, delivery_id, by=actor(key), reason=body.reason)
    except OperationRefused as exc:
        raise await _refused(store, delivery_id, exc) from None
    return ActedOut(id=delivery_id, state="cancelled")


@router.post("/messages/{delivery_id:int}/resolve", response_model=ActedOut,
             tags=["messages"], summary="Settle one ambiguous message",
             responses=OPERATE_ERRORS)
async def resolve_message(delivery_id: DeliveryId, body: ResolveIn, store: StoreDep,
                          key: Operator) -> ActedOut:
    """For a message the provider may have accepted, held for an operator: mark it sent,
    send it again with the same key, or dead-letter it. Refused (409) unless it is still
    ambiguous. Scope: `operate`."""
    try:
        await operations.resolve(store, delivery_id, body.resolution, by=actor(key),
                                 note=body.note,
                                 provider_message_id=body.provider_message_id)
    except OperationRefused as exc:
        raise await _refused(store, delivery_id, exc) from None
    delivery = await store.get(delivery_id)
    return ActedOut(id=delivery_id, state=str(delivery.state) if delivery else "unknown")


@router.post("/messages/cancel", response_model=BulkOut, tags=["messages"],
             summary="Cancel the queued messages of a selection (dry run, then confirm)",
             responses=OPERATE_ERRORS)
async def cancel_messages(body: BulkCancelIn, store: StoreDep, key: Operator) -> BulkOut:
    """Two calls: `{"dry_run": true, ...filters}` counts the selection and answers
    `matched` and `upto_id`; the same filters with `"expected": matched, "upto_id":
    upto_id` cancel them. Only messages up to `upto_id` are touched; refused (409, with the
    new count in `preview`) if the selection grew past `expected`. State: `queued`
    (default), `pending` or `retrying`. Scope: `operate`."""
    return await _bulk(operations.cancel_matching(
        store, body.selection(), by=actor(key), reason=body.reason, expected=body.expected,
        upto_id=body.upto_id, dry_run=body.dry_run))


@router.post("/messages/resolve", response_model=BulkOut, tags=["messages"],
             summary="Settle the ambiguous messages of a selection (dry run, then confirm)",
             responses=OPERATE_ERRORS)
async def resolve_messages(body: BulkResolveIn, store: StoreDep, key: Operator) -> BulkOut:
    """As `POST /v1/messages/cancel`, for messages in state `ambiguous` (the default), all
    settled alike (`sent`, `resend` or `dead`). Scope: `operate`."""
    return await _bulk(operations.resolve_matching(
        store, body.selection(), body.resolution, by=actor(key), note=body.note,
        expected=body.expected, upto_id=body.upto_id, dry_run=body.dry_run))


async def _bulk(action: Awaitable[BulkResult]) -> BulkOut:
    try:
        return BulkOut.of(await action)
    except ConfirmationRequired as exc:
        raise ProblemError(409, "confirmation-required", "Confirmation required", str(exc),
                           extra={"preview": BulkOut.of(exc.preview).model_dump()}) from None
    except OperationRefused as exc:
        raise ProblemError(409, "not-applicable", "Not applicable", str(exc)) from None


async def _refused(store: Store, delivery_id: int, exc: OperationRefused) -> ProblemError:
    if await store.get(delivery_id) is None:
        return not_found(f"no message with id {delivery_id}")
    return ProblemError(409, "not-applicable", "Not applicable", str(exc))


# -- dead letters ------------------------------------------------------------------------
@router.get("/dead-letters", response_model=DeadLetterList, tags=["dead letters"],
            summary="Triage: dead letters by reason, lane, template, import, time",
            responses=READ_ERRORS)
async def list_dead_letters(
    store: StoreDep, _key: Reader,
    reason: Annotated[Text | None, Query(max_length=100, description=(
        "permanent, budget_exhausted, expired, handler_error, ambiguous_unresolved"))] = None,
    cause: Annotated[Text | None, Query(max_length=100, description=(
        "unknown_template, account_or_configuration, handler_error, ambiguous_unresolved, "
        "rejected_recipient, rejected_content, rejected_other, budget_exhausted, "
        "expired"))] = None,
    lane: Annotated[Text | None, Query(max_length=100)] = None,
    template_id: Annotated[Text | None, Query(max_length=200)] = None,
    import_id: Annotated[Text | None, Query(max_length=200)] = None,
    since: Annotated[IsoTime | None, Query(description="Dead-lettered at or after "
                                                             "(ISO 8601, with a zone).")] = None,
    until: Annotated[IsoTime | None, Query(description="Dead-lettered before.")] = None,
    replayed: Annotated[bool | None, Query(description="Only entries replayed before "
                                                       "(true) or never (false).")] = None,
    include_closed: Annotated[bool, Query(description="Also discarded entries and "
                                                      "replayed-and-sent ones.")] = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DeadLetterList:
    """Oldest first; open entries unless `include_closed`. Scope: `read`."""
    entries = await store.list_dead_letters(
        DeadLetterFilter(reason=reason, cause=cause, lane=lane, template_id=template_id,
                         import_id=import_id, since=since, until=until, replayed=replayed,
                         include_closed=include_closed), limit=limit)
    return DeadLetterList(dead_letters=[DeadLetterOut.of(e) for e in entries],
                          by_reason=dict(Counter(e.reason for e in entries)))


@router.get("/dead-letters/{delivery_id:int}", response_model=DeadLetterDetail,
            tags=["dead letters"], summary="Everything a dead letter keeps",
            responses=problem_responses(401, 403, 404, 422, 503))
async def get_dead_letter(delivery_id: DeliveryId, store: StoreDep,
                          _key: Reader) -> DeadLetterDetail:
    """Snapshot, reason, the provider's last response verbatim, attempt history.
    Scope: `read`."""
    entry = await store.dead_letter(delivery_id)
    if entry is None:
        raise not_found(f"no dead letter for delivery {delivery_id}")
    parts = (await store.attachments_among([delivery_id])).get(delivery_id, ())
    detail = DeadLetterDetail.of(entry)
    detail.attachments = [AttachmentOut.of(i, p) for i, p in enumerate(parts)]
    return detail


@router.post("/dead-letters/{delivery_id:int}/replay", response_model=ReplayOneOut,
             tags=["dead letters"], summary="Replay one entry (the canary)",
             responses=OPERATE_ERRORS)
async def replay_dead_letter(
    delivery_id: DeliveryId, store: StoreDep, key: Operator,
    body: Annotated[ReplayOneIn | None, Body()] = None,
) -> ReplayOneOut:
    """Sends the same row again: same key, same rendered content, a fresh attempt budget.
    Refused (409) when discarded, not dead, or no longer useful. `dry_run` runs the same
    checks and replays nothing. Once it is sent, replay the
    rest of its selection with `POST /v1/dead-letters/replay`. Scope: `operate`."""
    body = body or ReplayOneIn()
    if await store.dead_letter(delivery_id) is None:
        raise not_found(f"no dead letter for delivery {delivery_id}")
    window = timedelta(seconds=body.valid_for_s) if body.valid_for_s else None
    entry = await replay_one(store, delivery_id, by=actor(key), valid_for=window,
                             dry_run=body.dry_run)
    return ReplayOneOut(
        delivery_id=entry.delivery_id, key=_str(entry.snapshot.get("idempotency_key")),
        replayed=not body.dry_run,
        next="dry run: nothing was replayed; send it again without dry_run to replay"
        if body.dry_run else
        "when it is sent, replay the rest with POST /v1/dead-letters/replay and the "
        "same filters")


@router.post("/dead-letters/replay", response_model=ReplayPlanOut, tags=["dead letters"],
             summary="Replay the rest of a selection, once its canary was sent",
             responses=OPERATE_ERRORS)
async def replay_dead_letters(
    store: StoreDep, key: Operator,
    body: Annotated[ReplaySelectionIn | None, Body()] = None,
) -> ReplayPlanOut:
    """Refused (409) until one entry of the selection was replayed and has been sent. Takes
    only entries never replayed before; skips those no longer useful. `dry_run` shows what
    would be replayed. Scope: `operate`."""
    body = body or ReplaySelectionIn()
    window = timedelta(seconds=body.valid_for_s) if body.valid_for_s else None
    plan = await replay_selection(store, DeadLetterFilter(**selection_kwargs(body)),
                                  by=actor(key), dry_run=body.dry_run, valid_for=window,
                                  limit=body.limit)
    return ReplayPlanOut.of(plan)


@router.post("/dead-letters/{delivery_id:int}/discard", response_model=DiscardOut,
             tags=["dead letters"], summary="Close an entry without sending it",
             responses=OPERATE_ERRORS)
async def discard_dead_letter(delivery_id: DeliveryId, body: DiscardIn, store: StoreDep,
                              key: Operator) -> DiscardOut:
    """The entry stays for the record until retention prunes it. Scope: `operate`."""
    if not await store.discard_dead_letter(delivery_id, body.reason, actor(key)):
        entry = await store.dead_letter(delivery_id)
        if entry is None:
            raise not_found(f"no dead letter for delivery {delivery_id}")
        why = (f"it was discarded already ({entry.discard_reason})" if entry.discarded_at
               else f"its delivery is {entry.delivery_state}, not dead")
        raise ProblemError(409, "not-open", "Dead letter not open",
                           f"dead letter {delivery_id} is not open: {why}")
    return DiscardOut(delivery_id=delivery_id, discarded=True, reason=body.reason)


# -- lanes and status --------------------------------------------------------------------
LaneName = Annotated[str, Path(min_length=1, max_length=100, description="A configured lane.")]


def _check_lane(state: AppState, lane: str) -> None:
    if lane not in state.lanes:
        raise not_found(f"unknown lane {lane!r} (configured: {', '.join(state.lanes)})")


@router.post("/lanes/{lane}/pause", response_model=LaneControlOut, tags=["operating"],
             summary="Pause a lane on every worker", responses=OPERATE_ERRORS)
async def pause(lane: LaneName, request: Request, store: StoreDep,
                key: Operator) -> LaneControlOut:
    """Every worker stops claiming the lane within a second; nothing is deleted.
    Scope: `operate`."""
    _check_lane(app_state(request), lane)
    await pause_lane(store, lane, by=actor(key))
    return LaneControlOut(lane=lane, paused=True)


@router.post("/lanes/{lane}/resume", response_model=LaneControlOut, tags=["operating"],
             summary="Resume a paused lane", responses=OPERATE_ERRORS)
async def resume(lane: LaneName, request: Request, store: StoreDep,
                 _key: Operator) -> LaneControlOut:
    """Scope: `operate`."""
    _check_lane(app_state(request), lane)
    await resume_lane(store, lane)
    return LaneControlOut(lane=lane, paused=False)


@router.get("/status", response_model=StatusOut, tags=["operating"],
            summary="The four numbers (as `postlane status --json`)",
            responses=problem_responses(401, 403, 503))
async def status(store: StoreDep, _key: Reader) -> dict[str, Any]:
    """Depth and oldest age per lane, states, attempts, open dead letters, pauses, breakers.
    Scope: `read`."""
    return (await fleet_status(store)).as_json()


# -- provider webhooks -------------------------------------------------------------------
@router.post(
    "/webhooks/{provider}", response_model=WebhookOut, tags=["webhooks"],
    summary="A provider's delivery event (signed by the provider, no API key)",
    responses=problem_responses(400, 401, 413, 503),
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"type": "object"}}}}},
)
async def webhook(
    provider: Annotated[str, Path(min_length=1, max_length=50,
                                  description="sandbox, resend, ses, postmark or smtp.")],
    request: Request, response: Response, store: StoreDep,
    token: Annotated[str | None, Query(
        max_length=500, description="postmark and smtp: the shared secret, when the "
                                    "webhook URL carries it as a parameter rather than as "
                                    "basic-auth credentials.")] = None,
) -> WebhookOut:
    """Verified by the provider's signature (sandbox, resend, ses) or a shared secret
    (postmark, smtp: basic auth or `?token=`), 401 when it does not verify; recorded once.
    A payload that cannot be read or stored (not a JSON object, nested deeper than 32
    levels, a NUL or a lone surrogate in a string) is answered 400. `smtp` takes a raw
    message (a DSN, a feedback report, a mailto unsubscribe) as the body."""
    try:
        from postlane import webhooks
    except ImportError:  # pragma: no cover - the module ships with the package
        raise ProblemError(501, "not-implemented", "Not implemented",
                           "webhooks are not available in this build") from None
    body = await request.body()
    config = webhooks.WebhookConfig.from_env(app_state(request).sns_certificates)
    try:
        result = await webhooks.receive(store, provider, dict(request.headers), body, config,
                                        token=token)
    except webhooks.WebhookMalformed as exc:
        raise ProblemError(400, "webhook-malformed", "Malformed webhook", str(exc)) from None
    except webhooks.WebhookRejected as exc:
        raise ProblemError(401, "webhook-rejected", "Webhook rejected", str(exc),
                           headers={"WWW-Authenticate": "Signature"}) from None
    except webhooks.CertificateUnavailable as exc:
        raise ProblemError(503, "certificate-unavailable", "Certificate unavailable",
                           f"{exc}; the notification was not processed: send it again "
                           "later", headers={"Retry-After": "60"}) from None
    response.status_code = result.status
    return WebhookOut(status=result.status, detail=result.detail,
                      events=list(getattr(result, "events", [])))


# -- helpers -----------------------------------------------------------------------------
def _str(value: object) -> str | None:
    return None if value is None else str(value)

