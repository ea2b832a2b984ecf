"""The messages browser (every delivery, filtered, in keyset pages), its bulk actions (a
count and a confirmation page first: the preview of ``postlane.operations``, whose count and
bound the form carries back to the same operation the HTTP API runs), and one message's
page: its content rendered, attempts, provider events, timeline, attachments and the
buttons that apply to it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import fields
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from postlane.api.downloads import attachment_response, stored_part
from postlane.api.models import AttachmentOut, DeadLetterOut, EventOut, MessageOut
from postlane.api.state import actor
from postlane.core.records import FILTER_STATES, DeliveryFilter
from postlane.dashboard.views import (
    PREFIX,
    Csrf,
    Session,
    Signed,
    back,
    guard,
    refused,
    render,
    unstorable,
)
from postlane.errors import PostlaneError
from postlane.operations import (
    BULK_STATES,
    OperationRefused,
    Resolution,
    cancel,
    cancel_matching,
    discard_matching,
    preview_matching,
    replay_matching,
    resolve,
    resolve_matching,
)

router = APIRouter(prefix=PREFIX, include_in_schema=False)

PAGE_SIZE = 50
COUNT_CAP = 10_000
"""The browser counts exactly up to this many; beyond, the page says "more than" (a bulk
action's confirmation counts exactly)."""
FILTER_FIELDS = tuple(f.name for f in fields(DeliveryFilter))
"""``DeliveryFilter``'s fields, as the browser's query and the bulk forms carry them."""

PREVIEW_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; "
               "sandbox; frame-ancestors 'self'")
"""A message's HTML as the preview frame loads it: no script, no remote image, font or
style (a tracking pixel stays unloaded), no form, and only inside the dashboard."""

ACTIONS: dict[str, str] = {
    "cancel": "Cancel queued",
    "discard": "Discard dead",
    "replay": "Replay (staged)",
    "resolve": "Resolve ambiguous",
}


class BadSelection(ValueError):
    """A filter the browser cannot use (unknown state, text no database holds)."""


def selection_from(values: Mapping[str, str]) -> DeliveryFilter:
    """The browser's filters from a query or a form; empty fields are unset."""
    found = {name: value for name in FILTER_FIELDS
             if (value := (values.get(name) or "").strip())}
    bad = unstorable(**found)
    if bad:
        raise BadSelection(bad)
    try:
        return DeliveryFilter(**found)
    except ValueError as exc:
        raise BadSelection(str(exc)) from None


def delivery_id(value: str, name: str, what: str = "a delivery id") -> int | None:
    """An id from a query or a form (a page cursor, a confirmed bound, or a confirmed
    count); None when empty."""
    value = value.strip()
    if not value:
        return None
    if not (value.isdigit() and len(value) < 19):
        raise BadSelection(f"{name} {value!r} is not {what}")
    return int(value)


def browser_url(selection: DeliveryFilter, **extra: str) -> str:
    query = selection.as_dict() | extra
    return f"{PREFIX}/messages" + (f"?{urlencode(query)}" if query else "")


def actions_for(selection: DeliveryFilter) -> list[tuple[str, str]]:
    """The bulk actions that apply to ``selection``, as (action, label)."""
    return [(action, label) for action, label in ACTIONS.items()
            if selection.state is None or selection.state in BULK_STATES[action]]


def plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def count_text(count: int, cap: int | None = COUNT_CAP) -> str:
    return f"more than {cap:,}" if cap is not None and count > cap else f"{count:,}"


# -- the browser ---------------------------------------------------------------------------
@router.get("/messages", response_model=None)
async def messages(request: Request, s: Signed, q: str = "", before: str = "") -> Response:
    """Every delivery, newest first, filtered; or a search by id, key or recipient (``q``),
    where one hit opens its page."""
    q = q.strip()
    if q:
        return await _search(request, s, q)
    base = {"s": s, "states": FILTER_STATES, "lanes": s.state.lanes, "q": ""}
    try:
        selection = selection_from(dict(request.query_params))
        cursor = delivery_id(before, "before")
    except BadSelection as exc:
        return render(request, "messages.html", {
            **base, "selection": DeliveryFilter(), "rows": [], "filters": {}},
            status_code=400, error=str(exc))
    rows = await s.store.list_deliveries(selection, before=cursor, limit=PAGE_SIZE + 1)
    older = rows[PAGE_SIZE - 1].id if len(rows) > PAGE_SIZE else None
    count, _ = await s.store.count_deliveries(selection, cap=COUNT_CAP)
    return render(request, "messages.html", {
        **base, "selection": selection, "filters": selection.as_dict(),
        "rows": rows[:PAGE_SIZE], "count": count_text(count),
        "older": browser_url(selection, before=str(older)) if older else None,
        "newest": browser_url(selection) if cursor else None,
        "actions": actions_for(selection) if s.can_operate else [],
        "query": urlencode(selection.as_dict()),
    })


async def _search(request: Request, s: Session, q: str) -> Response:
    bad = unstorable(search=q)
    base = {"s": s, "states": FILTER_STATES, "lanes": s.state.lanes, "q": q,
            "selection": DeliveryFilter(), "filters": {}, "rows": []}
    if bad:
        return render(request, "messages.html", {**base, "q": ""}, status_code=400,
                      error=bad)
    found: dict[int, Any] = {}
    candidates = []
    if q.isdigit() and len(q) < 19:
        candidates.append(await s.store.get(int(q)))
    candidates.append(await s.store.get(q))
    candidates += await s.store.find_deliveries(recipient=q, limit=50)
    for delivery in candidates:
        if delivery is not None:
            found.setdefault(delivery.id, delivery)
    if len(found) == 1:
        return RedirectResponse(f"{PREFIX}/messages/{next(iter(found))}", status_code=303)
    return render(request, "messages.html", {
        **base, "found": [MessageOut.of(d) for d in found.values()], "searched": True})


# -- bulk actions: count and confirm, then act ---------------------------------------------
@router.get("/bulk/{action}", response_class=HTMLResponse)
async def confirm(request: Request, action: str, s: Signed) -> HTMLResponse:
    if action not in ACTIONS:
        return refused(request, s, f"unknown bulk action {action!r}")
    try:
        counted = await preview_matching(s.store, action,
                                         selection_from(dict(request.query_params)))
    except (BadSelection, OperationRefused) as exc:
        return refused(request, s, str(exc))
    hidden = counted.selection.as_dict()
    if action != "replay":  # the preview's count and bound, confirmed by the form
        hidden |= {"expected": str(counted.matched), "upto_id": str(counted.upto_id)}
    return render(request, "bulk.html", {
        "s": s, "action": action, "label": ACTIONS[action], "count": counted.matched,
        "count_text": count_text(counted.matched, None), "upto_id": counted.upto_id,
        "fields": hidden, "selection": counted.selection,
        "back_to": browser_url(counted.selection),
        "resolutions": [str(r) for r in Resolution],
    })


@router.post("/bulk/{action}")
async def act(request: Request, action: str, s: Signed, csrf: Csrf) -> Response:
    form = {k: str(v) for k, v in (await request.form()).items()}
    try:
        selection = selection_from(form)
        expected = delivery_id(form.get("expected", ""), "expected", "a count")
        upto_id = delivery_id(form.get("upto_id", ""), "upto_id")
    except BadSelection as exc:
        return refused(request, s, str(exc))
    to = browser_url(selection)
    refusal = guard(s, csrf, to)
    if refusal:
        return refusal
    reason = form.get("reason", "").strip()
    bad = unstorable(reason=reason)
    if bad:
        return refused(request, s, bad)
    by = actor(s.key)
    try:
        text = await _act(s, action, selection, by, reason, form.get("resolution", ""),
                          expected, upto_id)
    except PostlaneError as exc:
        return back(to, str(exc), ok=False)
    return back(to, text)


async def _act(s: Session, action: str, selection: DeliveryFilter, by: str, reason: str,
               resolution: str, expected: int | None, upto_id: int | None) -> str:
    confirmed: dict[str, Any] = {"expected": expected, "upto_id": upto_id}
    if action == "cancel":
        result = await cancel_matching(s.store, selection, by=by, reason=reason, **confirmed)
        text = "cancelled " + plural(result.acted, "queued delivery", "queued deliveries")
    elif action == "discard":
        result = await discard_matching(s.store, selection, by=by, reason=reason, **confirmed)
        text = "discarded " + plural(result.acted, "dead letter", "dead letters")
    elif action == "resolve":
        if resolution not in set(Resolution):
            raise OperationRefused(f"choose how to resolve: {', '.join(Resolution)}")
        result = await resolve_matching(s.store, selection, Resolution(resolution), by=by,
                                        note=reason, **confirmed)
        done = plural(result.acted, "ambiguous delivery", "ambiguous deliveries")
        text = f"resolved {done} as {resolution}"
    elif action == "replay":
        plan = await replay_matching(s.store, selection, by=by)
        if plan.replay == [plan.canary]:
            return (f"replayed the canary, delivery {plan.canary}; once it is sent, "
                    "replay the rest of this selection")
        text = (f"canary {plan.canary} was sent; replayed "
                f"{plural(len(plan.replay), 'entry', 'entries')}")
        if plan.skipped_expired:
            text += f"; {len(plan.skipped_expired)} no longer useful (discard them)"
        return text
    else:
        raise OperationRefused(f"unknown bulk action {action!r}")
    if result.acted < result.matched:
        left = plural(result.matched - result.acted, "delivery", "deliveries")
        text += f"; {left} left the selection meanwhile, left alone"
    return text


# -- one message ---------------------------------------------------------------------------
@router.get("/messages/{delivery_id}", response_class=HTMLResponse)
async def message(request: Request, delivery_id: int, s: Signed) -> HTMLResponse:
    delivery = await s.store.get(delivery_id) if 0 < delivery_id < 2**63 else None
    if delivery is None:
        return render(request, "messages.html", {
            "s": s, "q": str(delivery_id), "states": FILTER_STATES, "lanes": s.state.lanes,
            "selection": DeliveryFilter(), "filters": {}, "rows": [], "found": [],
            "searched": True}, status_code=404, error=f"no message with id {delivery_id}")
    events = [EventOut.of(e) for e in await s.store.timeline(delivery.id)]
    attempts = [e for e in events if "outcome" in e.data]
    entry = await s.store.dead_letter(delivery.id)
    parts = (await s.store.attachments_among([delivery.id])).get(delivery.id, ())
    return render(request, "message.html", {
        "s": s, "m": MessageOut.of(delivery), "text": delivery.text,
        "pair": await s.store.sms_fallback_pair(delivery.id),
        "attachments": [AttachmentOut.of(i, p) for i, p in enumerate(parts)],
        "has_html": bool(delivery.html), "events": events,
        "attempts": attempts,
        "failed_before": any(e.data["outcome"] != "accepted" for e in attempts),
        "provider_events": [e for e in events if e.kind.startswith("provider:")],
        "dead": DeadLetterOut.of(entry) if entry else None,
        "resolutions": [str(r) for r in Resolution],
        "age": timedelta(seconds=max(0.0, time.time() - delivery.created_at.timestamp())),
    })


@router.get("/messages/{delivery_id}/html", response_model=None)
async def message_html(delivery_id: int, s: Signed) -> Response:
    """The HTML part alone, for the preview frame: sandboxed, nothing remote loads."""
    delivery = await s.store.get(delivery_id) if 0 < delivery_id < 2**63 else None
    body = delivery.html if delivery is not None and delivery.html else ""
    return Response(body, status_code=200 if body else 404, media_type="text/html", headers={
        "Content-Security-Policy": PREVIEW_CSP, "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})


@router.get("/messages/{delivery_id}/attachments/{position}")
async def attachment(delivery_id: int, position: int, s: Signed) -> Response:
    """Download a stored part, byte for byte: for operators only (it is the customer's
    content: a receipt, an invoice), never shown in place."""
    if not s.can_operate:
        return Response(f"API key {s.key.name} lacks the 'operate' scope", status_code=403,
                        media_type="text/plain")
    if delivery_id >= 2**63:
        return Response("no such message", status_code=404, media_type="text/plain")
    return attachment_response(await stored_part(s.store, delivery_id, position))


@router.post("/messages/{delivery_id}/cancel")
async def cancel_one(delivery_id: int, s: Signed, csrf: Csrf) -> Response:
    to = f"{PREFIX}/messages/{delivery_id}"
    refusal = guard(s, csrf, to)
    if refusal:
        return refusal
    try:
        await cancel(s.store, delivery_id, by=actor(s.key))
    except PostlaneError as exc:
        return back(to, str(exc), ok=False)
    return back(to, f"cancelled delivery {delivery_id}")


@router.post("/messages/{delivery_id}/resolve")
async def resolve_one(request: Request, delivery_id: int, s: Signed, csrf: Csrf,
                      resolution: Annotated[str, Form()] = "",
                      note: Annotated[str, Form()] = "") -> Response:
    to = f"{PREFIX}/messages/{delivery_id}"
    refusal = guard(s, csrf, to)
    if refusal:
        return refusal
    bad = unstorable(note=note)
    if bad:
        return refused(request, s, bad)
    if resolution not in set(Resolution):
        return back(to, f"choose how to resolve: {', '.join(Resolution)}", ok=False)
    try:
        await resolve(s.store, delivery_id, Resolution(resolution), by=actor(s.key),
                      note=note.strip())
    except PostlaneError as exc:
        return back(to, str(exc), ok=False)
    return back(to, f"resolved delivery {delivery_id} as {resolution}")
