"""The operator dashboard: server-rendered pages over the same core calls as the API.

Signing in takes an API key with the ``read`` scope (pasted once; the browser keeps only a
signed session cookie naming the key); buttons that change something need ``operate``.
Every form carries a CSRF token; every action redirects back with a one-line notice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote, unquote, urlencode

from fastapi import APIRouter, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from postlane.api.keys import authenticate
from postlane.api.models import DeadLetterOut
from postlane.api.sessions import COOKIE
from postlane.api.state import AppState, actor, app_state
from postlane.core.breaker import CONTROL_PREFIX as BREAKER_PREFIX
from postlane.core.records import ApiKey, Control, DeadLetterFilter, view_state
from postlane.core.states import DeadReason
from postlane.core.validation import text_problem
from postlane.dashboard.charts import bars, human_seconds, per_second, sparkline
from postlane.dead_letters import replay_one, replay_selection
from postlane.errors import PostlaneError
from postlane.status import breaker_reason
from postlane.store.base import Store
from postlane.worker.controls import pause_lane, resume_lane

FLASH = "postlane_flash"
PREFIX = "/dashboard"

_root = resources.files("postlane.dashboard")
templates = Jinja2Templates(directory=str(_root.joinpath("templates")))
templates.env.globals.update(human_seconds=human_seconds, sparkline=sparkline, bars=bars,
                             per_second=per_second, view_state=view_state)
templates.env.filters["when"] = lambda d: d.strftime("%Y-%m-%d %H:%M:%S") if d else ""


def unix_when(t: float | None) -> str:
    """A unix time as the pages show times; a time no calendar holds as "far ahead"."""
    try:
        return datetime.fromtimestamp(float(t), UTC).strftime("%Y-%m-%d %H:%M:%S") if t else ""
    except (OverflowError, OSError, ValueError):
        return "far ahead"


templates.env.filters["unix_when"] = unix_when
templates.env.filters["clock"] = lambda d: d.strftime("%H:%M:%S.%f")[:-3] if d else ""

router = APIRouter(prefix=PREFIX, include_in_schema=False)


class LoginRequired(Exception):
    def __init__(self, next_url: str) -> None:
        self.next_url = next_url


@dataclass(frozen=True, slots=True)
class Session:
    key: ApiKey
    cookie: str
    csrf: str
    store: Store
    state: AppState
    breakers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Open or half-open breakers by account, for the banner every page shows."""

    @property
    def can_operate(self) -> bool:
        return "operate" in self.key.scopes


async def session(request: Request) -> Session:
    """The signed-in operator, or a redirect to the login form."""
    state = app_state(request)
    store = state.require_store()
    cookie = request.cookies.get(COOKIE, "")
    signed = state.sessions.read(cookie)
    key = await store.get_api_key(key_id=signed.key_id) if signed is not None else None
    if (key is None or signed is None or not key.active or "read" not in key.scopes
            or state.sessions.signed_out(signed, key.sessions_after)):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target if request.method == "GET" else PREFIX)
    breakers = {account: {**record, "why": breaker_reason(record)}
                for account, record in _breakers(await store.get_controls()).items()}
    return Session(key, cookie, state.sessions.csrf_token(cookie), store, state, breakers)


def _breakers(controls: dict[str, Control]) -> dict[str, dict[str, Any]]:
    return {name.removeprefix(BREAKER_PREFIX): control.value
            for name, control in sorted(controls.items()) if name.startswith(BREAKER_PREFIX)}


Signed = Annotated[Session, Depends(session)]
Csrf = Annotated[str, Form()]


def render(request: Request, name: str, context: dict[str, Any], *,
           status_code: int = 200, consume_notice: bool = True,
           error: str | None = None) -> HTMLResponse:
    flash = request.cookies.get(FLASH) if consume_notice else None
    notice = {"kind": "error", "text": error} if error else None
    if flash and not error:
        kind, _, text = unquote(flash).partition(":")
        notice = {"kind": kind if kind in ("ok", "error") else "ok", "text": text}
    response = templates.TemplateResponse(
        request, name, {"base": PREFIX, "notice": notice, **context}, status_code=status_code)
    if flash:
        response.delete_cookie(FLASH, path=PREFIX)
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'")
    response.headers["Cache-Control"] = "no-store"
    return response


def back(to: str, text: str, *, ok: bool = True) -> RedirectResponse:
    """Redirect (303) with a notice for the next page."""
    response = RedirectResponse(to, status_code=303)
    response.set_cookie(FLASH, quote(f"{'ok' if ok else 'error'}:{text[:300]}"), path=PREFIX,
                        httponly=True, samesite="strict", max_age=60)
    return response


def guard(s: Session, csrf: str, to: str) -> RedirectResponse | None:
    """Refuse an action without a valid CSRF token or the ``operate`` scope."""
    if not s.state.sessions.check_csrf(s.cookie, csrf):
        return back(to, "the form expired; try again", ok=False)
    if not s.can_operate:
        return back(to, f"API key {s.key.name} lacks the 'operate' scope", ok=False)
    return None


def unstorable(**values: str | None) -> str | None:
    """Why one of a form's or a query's ``values`` cannot be looked up or stored (a NUL,
    a lone surrogate: the database refuses both), or None. Answered 400, never a 500."""
    for name, value in values.items():
        problem = text_problem(value) if value else None
        if problem is not None:
            return f"{name.replace('_', ' ')} {problem}; nothing was done"
    return None


def refused(request: Request, s: Session, why: str) -> HTMLResponse:
    """A 400 page for input no action can use; the operator fixes it and tries again."""
    return render(request, "base.html", {"s": s}, status_code=400, error=why)


def local(url: str) -> str:
    """Only redirect within the dashboard (no open redirects)."""
    return url if url.startswith(PREFIX) and not url.startswith("//") else PREFIX


# -- signing in --------------------------------------------------------------------------
@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str = PREFIX) -> HTMLResponse:
    return render(request, "login.html", {"next": local(next), "error": None})


@router.post("/login", response_model=None)
async def login(request: Request, api_key: Annotated[str, Form()],
                next: Annotated[str, Form()] = PREFIX) -> Response:
    state = app_state(request)
    key = await authenticate(state.require_store(), api_key)
    error = None
    if key is None:
        error = "That API key is unknown or revoked."
    elif "read" not in key.scopes:
        error = f"API key {key.name} lacks the 'read' scope the dashboard needs."
    if key is None or error:
        return render(request, "login.html", {"next": local(next), "error": error},
                      status_code=401)
    response = RedirectResponse(local(next), status_code=303)
    response.set_cookie(COOKIE, state.sessions.issue(key.id), path=PREFIX, httponly=True,
                        samesite="strict", secure=state.cookie_secure,
                        max_age=state.sessions.max_age_s)
    return response


@router.post("/logout")
async def logout(s: Signed, csrf: Csrf) -> RedirectResponse:
    """End the session on the server (every session of the key issued until now), not
    only the cookie of this browser; a forged form (no CSRF token) signs nobody out."""
    if not s.state.sessions.check_csrf(s.cookie, csrf):
        return back(PREFIX, "the form expired; try again", ok=False)
    await s.store.end_api_key_sessions(s.key.id, time.time())
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    response.delete_cookie(COOKIE, path=PREFIX)
    return response


# -- the overview ------------------------------------------------------------------------
async def lanes_context(s: Session) -> dict[str, Any]:
    sampler = s.state.require_sampler()
    status = await sampler.current(max_age_s=0)  # fresh: it must show the last action's effect
    now = time.time()
    lanes = []
    for name in sorted(set(s.state.lanes) | set(status.stats.lanes)):
        lane = status.stats.lanes.get(name)
        series = sampler.series(name)
        lanes.append({
            "name": name, "depth": lane.depth if lane else 0,
            "oldest_age_s": lane.oldest_age_s if lane else 0.0,
            "paused": name in status.paused_lanes,
            "depth_chart": sparkline([(t, d) for t, d, _ in series], now=now,
                                     window_s=sampler.window_s, label=f"{name} depth"),
            "age_chart": sparkline([(t, a) for t, _, a in series], now=now,
                                   window_s=sampler.window_s, label=f"{name} oldest age",
                                   unit="s"),
        })
    attempts = sorted(status.stats.attempts.items(), key=lambda kv: int(kv[0]))
    return {"s": s, "lanes": lanes, "status": status,
            "attempts_chart": bars([(f"#{a}", n) for a, n in attempts],
                                   label="active deliveries by attempt"),
            "taken_at": datetime.fromtimestamp(status.taken_at, UTC)}


@router.get("", response_class=HTMLResponse)
async def overview(request: Request, s: Signed) -> HTMLResponse:
    context = await lanes_context(s)
    context["imports"] = await _imports(s.store)
    return render(request, "overview.html", context)


@router.get("/partials/lanes", response_class=HTMLResponse)
async def lanes_partial(request: Request, s: Signed) -> HTMLResponse:
    """The lanes panel alone, for the page's periodic refresh (leaves notices alone)."""
    return render(request, "_lanes.html", await lanes_context(s), consume_notice=False)


@router.post("/lanes/{lane}/{action}")
async def lane_action(lane: str, action: str, s: Signed, csrf: Csrf) -> RedirectResponse:
    refusal = guard(s, csrf, PREFIX)
    if refusal:
        return refusal
    if lane not in s.state.lanes:
        return back(PREFIX, f"unknown lane {lane!r}", ok=False)
    if action == "pause":
        await pause_lane(s.store, lane, by=actor(s.key))
        return back(PREFIX, f"lane {lane} paused: workers stop claiming it within a second")
    if action == "resume":
        await resume_lane(s.store, lane)
        return back(PREFIX, f"lane {lane} resumed")
    return back(PREFIX, f"unknown action {action!r}", ok=False)


async def _imports(store: Store) -> list[dict[str, Any]] | None:
    """Recent import runs with their counters, or None when this build has no imports."""
    try:
        from postlane.imports import import_status
    except ImportError:  # pragma: no cover - imports ship with the package
        return None
    found = []
    for record in await store.list_imports(limit=10):
        status = await import_status(store, record.import_id)
        if status is not None:
            found.append(status.as_json())
    return found


@router.post("/imports/{import_id}/{action}")
async def import_action(request: Request, import_id: str, action: str, s: Signed,
                        csrf: Csrf) -> Response:
    refusal = guard(s, csrf, PREFIX)
    if refusal:
        return refusal
    bad = unstorable(import_id=import_id)
    if bad:
        return refused(request, s, bad)
    from postlane import imports

    if action == "pause":
        await imports.pause(s.store, import_id, by=actor(s.key))
        return back(PREFIX, f"import {import_id} paused")
    if action == "resume":
        await imports.resume(s.store, import_id)
        return back(PREFIX, f"import {import_id} resumed")
    return back(PREFIX, f"unknown action {action!r}", ok=False)


# -- dead letters ------------------------------------------------------------------------
FILTERS = ("reason", "lane", "template_id", "import_id")


def _filters(values: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k in FILTERS if (v := (values.get(k) or "").strip())}


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters(request: Request, s: Signed) -> HTMLResponse:
    filters = _filters(dict(request.query_params))
    include_closed = request.query_params.get("include_closed") == "1"
    bad = unstorable(**filters)
    if bad:
        return render(request, "dead_letters.html", {
            "s": s, "entries": [], "filters": {}, "include_closed": include_closed,
            "reasons": [str(r) for r in DeadReason], "lanes": s.state.lanes, "query": ""},
            status_code=400, error=bad)
    entries = await s.store.list_dead_letters(
        DeadLetterFilter(**filters, include_closed=include_closed), limit=200)  # type: ignore[arg-type]
    return render(request, "dead_letters.html", {
        "s": s, "entries": [DeadLetterOut.of(e) for e in entries], "filters": filters,
        "include_closed": include_closed, "reasons": [str(r) for r in DeadReason],
        "lanes": s.state.lanes, "query": urlencode(filters),
    })


def _dl_page(filters: dict[str, str]) -> str:
    return f"{PREFIX}/dead-letters" + (f"?{urlencode(filters)}" if filters else "")


@router.post("/dead-letters/replay")
async def replay_rest(request: Request, s: Signed, csrf: Csrf) -> Response:
    form = await request.form()
    filters = _filters({k: str(v) for k, v in form.items()})
    to = _dl_page(filters)
    refusal = guard(s, csrf, to)
    if refusal:
        return refusal
    bad = unstorable(**filters)
    if bad:
        return refused(request, s, bad)
    try:
        plan = await replay_selection(s.store, DeadLetterFilter(**filters),  # type: ignore[arg-type]
                                      by=actor(s.key))
    except PostlaneError as exc:
        return back(to, str(exc), ok=False)
    text = f"canary {plan.canary} was sent; replayed {len(plan.replay)} entries"
    if plan.skipped_expired:
        text += f"; {len(plan.skipped_expired)} no longer useful (discard them)"
    return back(to, text)


@router.post("/dead-letters/{delivery_id}/replay")
async def replay_entry(request: Request, delivery_id: int, s: Signed, csrf: Csrf,
                       back_to: Annotated[str, Form()] = "") -> Response:
    to = local(back_to or f"{PREFIX}/dead-letters")
    refusal = guard(s, csrf, to)
    if refusal:
        return refusal
    bad = unstorable(back_to=back_to)
    if bad:
        return refused(request, s, bad)
    try:
        await replay_one(s.store, delivery_id, by=actor(s.key))
    except PostlaneError as exc:
        return back(to, str(exc), ok=False)
    return back(to, f"replayed delivery {delivery_id} (the canary); once it is sent, "
                    "replay the rest of the selection")


@router.post("/dead-letters/{delivery_id}/discard")
async def discard_entry(request: Request, delivery_id: int, s: Signed, csrf: Csrf,
                        reason: Annotated[str, Form()] = "",
                        back_to: Annotated[str, Form()] = "") -> Response:
    to = local(back_to or f"{PREFIX}/dead-letters")
    refusal = guard(s, csrf, to)
    if refusal:
        return refusal
    bad = unstorable(reason=reason, back_to=back_to)
    if bad:
        return refused(request, s, bad)
    reason = reason.strip() or "discarded from the dashboard"
    if not await s.store.discard_dead_letter(delivery_id, reason, actor(s.key)):
        return back(to, f"delivery {delivery_id} has no open dead letter", ok=False)
    return back(to, f"discarded dead letter {delivery_id}: {reason}")


def mount(app: FastAPI) -> None:
    """Add the dashboard (pages, static files, login redirect) to ``app``."""
    from postlane.dashboard import fleet, messages

    app.include_router(router)
    app.include_router(messages.router)
    app.include_router(fleet.router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=str(_root.joinpath("static"))),
              name="dashboard-static")

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired) -> Response:
        return RedirectResponse(f"{PREFIX}/login?{urlencode({'next': exc.next_url})}",
                                status_code=303)
