"""The messages browser (every delivery, filtered, in keyset pages), its bulk actions (a
count and a confirmation page first, then the core operation of ``postlane.operations``),
and one message's page: its content rendered, attempts, provider events, timeline and the
buttons that apply to it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from postlane.api.models import DeadLetterOut, EventOut, MessageOut
from postlane.api.state import actor
from postlane.core.records import FILTER_FIELDS, MESSAGE_STATES, MessageFilter
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
    BULK_LIMIT,
    BULK_STATES,
    OperationRefused,
    Resolution,
    cancel,
    cancel_matching,
    discard_matching,
    replay_matching,
    resolve,
    resolve_matching,
    selection_for,
)

router = APIRouter(prefix=PREFIX, include_in_schema=False)

PAGE_SIZE = 50
COUNT_CAP = BULK_LIMIT
"""Counted exactly up to this many; beyond, the page says "more than"."""

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


def selection_from(values: Mapping[str, str]) -> MessageFilter:
    """The browser's filters from a query or a form; empty fields are unset."""
    found = {name: value for name in FILTER_FIELDS
             if (value := (values.get(name) or "").strip())}
    bad = unstorable(**{k: v for k, v in found.items()})
    if bad:
        raise BadSelection(bad)
    max_id = found.pop("max_id", None)
    if max_id is not None and not (max_id.isdigit() and len(max_id) < 19):
        raise BadSelection(f"max_id {max_id!r} is not a delivery id")
    try:
        return MessageFilter(**found, max_id=int(max_id) if max_id else None)
    except ValueError as exc:
        raise BadSelection(str(exc)) from None


def browser_url(selection: MessageFilter, **extra: str) -> str:
    query = {k: v for k, v in selection.as_query().items() if k != "max_id"} | extra
    return f"{PREFIX}/messages" + (f"?{urlencode(query)}" if query else "")


def actions_for(selection: MessageFilter) -> list[tuple[str, str]]:
    """The bulk actions that apply to ``selection``, as (action, label)."""
    return [(action, label) for action, label in ACTIONS.items()
            if selection.state is None or selection.state in BULK_STATES[action][0]]


def plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def count_text(count: int) -> str:
    return f"more than {COUNT_CAP:,}" if count > COUNT_CAP else f"{count:,}"


# -- the browser ---------------------------------------------------------------------------
@router.get("/messages", response_model=None)
async def messages(request: Request, s: Signed, q: str = "", before: str = "") -> Response:
    """Every delivery, newest first, filtered; or a search by id, key or recipient (``q``),
    where one hit opens its page."""
    q = q.strip()
    if q:
        return await _search(request, s, q)
    base = {"s": s, "states": MESSAGE_STATES, "lanes": s.state.lanes, "q": ""}
    try:
        selection = selection_from(dict(request.query_params))
        if before and not (before.isdigit() and len(before) < 19):
            raise BadSelection(f"before {before!r} is not a delivery id")
    except BadSelection as exc:
        return render(request, "messages.html", {
            **base, "selection": MessageFilter(), "rows": [], "filters": {}},
            status_code=400, error=str(exc))
    rows = await s.store.list_deliveries(selection, before_id=int(before) if before else None,
                                         limit=PAGE_SIZE + 1)
    older = rows[PAGE_SIZE - 1].id if len(rows) > PAGE_SIZE else None
    count = await s.store.count_deliveries(selection, cap=COUNT_CAP)
    return render(request, "messages.html", {
        **base, "selection": selection, "filters": selection.as_query(),
        "rows": rows[:PAGE_SIZE], "count": count_text(count),
        "older": browser_url(selection, before=str(older)) if older else None,
        "newest": browser_url(selection) if before else None,
        "actions": actions_for(selection) if s.can_operate else [],
        "query": urlencode(selection.as_query()),
    })


async def _search(request: Request, s: Session, q: str) -> Response:
    bad = unstorable(search=q)
    base = {"s": s, "states": MESSAGE_STATES, "lanes": s.state.lanes, "q": q,
            "selection": MessageFilter(), "filters": {}, "rows": []}
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
        selection = selection_for(action, selection_from(dict(request.query_params)))
    except (BadSelection, OperationRefused) as exc:
        return refused(request, s, str(exc))
    count = await s.store.count_deliveries(selection, cap=COUNT_CAP)
    newest = await s.store.list_deliveries(selection, limit=1)
    fields = selection.as_query()
    if newest and selection.max_id is None:
        fields["max_id"] = str(newest[0].id)  # what was counted; not what arrives later
    return render(request, "bulk.html", {
        "s": s, "action": action, "label": ACTIONS[action], "count": count,
        "count_text": count_text(count), "limit": BULK_LIMIT, "fields": fields,
        "selection": selection, "back_to": browser_url(selection),
        "resolutions": [str(r) for r in Resolution],
    })


@router.post("/bulk/{action}")
async def act(request: Request, action: str, s: Signed, csrf: Csrf) -> Response:
    form = {k: str(v) for k, v in (await request.form()).items()}
    try:
        selection = selection_from(form)
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
        text = await _act(s, action, selection, by, reason, form.get("resolution", ""))
    except PostlaneError as exc:
        return back(to, str(exc), ok=False)
    return back(to, text)


async def _act(s: Session, action: str, selection: MessageFilter, by: str, reason: str,
               resolution: str) -> str:
    if action == "cancel":
        result = await cancel_matching(s.store, selection, by=by, reason=reason)
        text = "cancelled " + plural(len(result.applied), "queued delivery",
                                     "queued deliveries")
    elif action == "discard":
        result = await discard_matching(s.store, selection, by=by, reason=reason)
        text = "discarded " + plural(len(result.applied), "dead letter", "dead letters")
    elif action == "resolve":
        if resolution not in set(Resolution):
            raise OperationRefused(f"choose how to resolve: {', '.join(Resolution)}")
        result = await resolve_matching(s.store, selection, Resolution(resolution), by=by,
                                        note=reason)
        done = plural(len(result.applied), "ambiguous delivery", "ambiguous deliveries")
        text = f"resolved {done} as {resolution}"
    elif action == "replay":
        result = await replay_matching(s.store, selection, by=by)
        if result.applied == [result.canary]:
            return (f"replayed the canary, delivery {result.canary}; once it is sent, "
                    "replay the rest of this selection")
        text = (f"canary {result.canary} was sent; replayed "
                f"{plural(len(result.applied), 'entry', 'entries')}")
        if result.expired:
            text += f"; {len(result.expired)} no longer useful (discard them)"
        return text
    else:
        raise OperationRefused(f"unknown bulk action {action!r}")
    if result.skipped:
        skipped = plural(result.skipped, "delivery", "deliveries")
        text += f"; {skipped} changed meanwhile, left alone"
    if result.more:
        text += f"; more than {BULK_LIMIT:,} matched: run it again for the rest"
    return text


# -- one message ---------------------------------------------------------------------------
@router.get("/messages/{delivery_id}", response_class=HTMLResponse)
async def message(request: Request, delivery_id: int, s: Signed) -> HTMLResponse:
    delivery = await s.store.get(delivery_id) if 0 < delivery_id < 2**63 else None
    if delivery is None:
        return render(request, "messages.html", {
            "s": s, "q": str(delivery_id), "states": MESSAGE_STATES, "lanes": s.state.lanes,
            "selection": MessageFilter(), "filters": {}, "rows": [], "found": [],
            "searched": True}, status_code=404, error=f"no message with id {delivery_id}")
    events = [EventOut.of(e) for e in await s.store.timeline(delivery.id)]
    attempts = [e for e in events if "outcome" in e.data]
    entry = await s.store.dead_letter(delivery.id)
    return render(request, "message.html", {
        "s": s, "m": MessageOut.of(delivery), "text": delivery.text,
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
