"""The fleet's pages: the workers that run (from their heartbeats in the database), the
outcomes of the last 24 hours per lane (from the per-minute counts the workers write, so
they outlive ``serve``), and the breaker banner's "probe now"."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response

from postlane.api.state import actor
from postlane.core.records import OUTCOME_SERIES, OutcomeMinute
from postlane.dashboard.charts import sparkline
from postlane.dashboard.views import (
    PREFIX,
    Csrf,
    Signed,
    back,
    guard,
    local,
    refused,
    render,
    unstorable,
)
from postlane.errors import PostlaneError
from postlane.operations import probe_breaker

router = APIRouter(prefix=PREFIX, include_in_schema=False)

WINDOW = timedelta(hours=24)
BUCKET_S = 600
"""The charts' resolution: ten-minute buckets, 144 over the day."""

SERIES_LABELS = {
    "sent": "sent/s", "throttled": "throttled", "transient": "transient errors",
    "ambiguous": "ambiguous", "dead": "dead-letter arrivals",
}


@router.get("/workers", response_class=HTMLResponse)
async def workers(request: Request, s: Signed) -> HTMLResponse:
    seen = await s.store.list_workers()
    return render(request, "workers.html", {
        "s": s, "workers": seen, "alive": sum(not w.gone for w in seen)})


def outcome_charts(minutes: list[OutcomeMinute], lanes: tuple[str, ...],
                   now: float) -> list[dict[str, Any]]:
    """Per lane: each series' total over the window and its chart in ``BUCKET_S`` buckets
    (``sent`` as a rate per second, the others as counts per bucket)."""
    buckets: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for row in minutes:
        buckets[(row.lane, row.outcome)][row.minute // BUCKET_S * BUCKET_S] += row.count
        totals[(row.lane, row.outcome)] += row.count
    start = int(now - WINDOW.total_seconds()) // BUCKET_S * BUCKET_S
    charts = []
    for lane in sorted(set(lanes) | {row.lane for row in minutes}):
        series = []
        for outcome in OUTCOME_SERIES:
            counts = buckets.get((lane, outcome), {})
            scale = 1 / BUCKET_S if outcome == "sent" else 1.0
            # Each bucket drawn at its start (the first at the window's start, so the
            # chart spans the whole day), the current one also at ``now``.
            points = [(max(float(t), now - WINDOW.total_seconds()), counts.get(t, 0) * scale)
                      for t in range(start, int(now) + 1, BUCKET_S)]
            points.append((now, points[-1][1]))
            total = totals.get((lane, outcome), 0)
            series.append({
                "outcome": outcome, "label": SERIES_LABELS[outcome], "total": total,
                "rate": total / WINDOW.total_seconds(),
                "chart": sparkline(points, now=now, window_s=WINDOW.total_seconds(),
                                   label=f"{lane} {SERIES_LABELS[outcome]}",
                                   unit="/s" if outcome == "sent" else ""),
            })
        charts.append({"lane": lane, "series": series})
    return charts


@router.get("/outcomes", response_class=HTMLResponse)
async def outcomes(request: Request, s: Signed) -> HTMLResponse:
    minutes = await s.store.outcome_minutes(WINDOW)
    return render(request, "outcomes.html", {
        "s": s, "lanes": outcome_charts(minutes, s.state.lanes, time.time()),
        "series": [SERIES_LABELS[o] for o in OUTCOME_SERIES]})


@router.post("/breakers/{account}/probe")
async def probe(request: Request, account: str, s: Signed, csrf: Csrf,
                back_to: Annotated[str, Form()] = "") -> Response:
    """The banner's "probe now": the open breaker is due at once (``probe_breaker``)."""
    to = local(back_to or PREFIX)
    refusal = guard(s, csrf, to)
    if refusal:
        return refusal
    bad = unstorable(account=account, back_to=back_to)
    if bad:
        return refused(request, s, bad)
    try:
        await probe_breaker(s.store, account, by=actor(s.key))
    except PostlaneError as exc:
        return back(to, str(exc), ok=False)
    return back(to, f"breaker {account}: a worker sends the probe within a second; "
                    "the banner goes once it succeeds")
