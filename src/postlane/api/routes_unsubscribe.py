"""``/unsubscribe/{token}``: the one-click unsubscribe of bulk mail (RFC 8058).

No session and no API key: the signed token is the credential (``webhooks.unsubscribe``).
``POST`` is what mail clients send (``List-Unsubscribe=One-Click``) and what the page's
button sends; ``GET`` shows the page and changes nothing, since link scanners follow every
link in a message. Answers are small HTML pages; a token that does not verify is 400.
"""

from __future__ import annotations

import html
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from postlane.api.problems import problem_responses
from postlane.api.state import app_state
from postlane.core.unsubscribe import ONE_CLICK, PATH
from postlane.webhooks.unsubscribe import InvalidToken, claims_of, one_click

log = logging.getLogger("postlane.api")

router = APIRouter(tags=["unsubscribe"])

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<style>body{{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem}}
button{{font-size:1rem;padding:.5rem 1rem}}</style></head>
<body><h1>{title}</h1>{body}</body></html>"""


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(_PAGE.format(title=html.escape(title), body=body), status_code=status,
                        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


def _invalid(exc: InvalidToken) -> HTMLResponse:
    why = str(exc)
    hint = "" if "not configured" in why else " Use the link of a more recent message."
    return _page("This link does not work", f"<p>{html.escape(why)}.{hint}</p>", 400)


_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/html": {"schema": {"type": "string"}}}},
    400: {"description": "The token does not verify (or unsubscribe is not configured): "
                         "an HTML page saying so; nothing recorded.",
          "content": {"text/html": {"schema": {"type": "string"}}}},
    **problem_responses(503),
}


@router.get(PATH + "{token}", response_class=HTMLResponse, responses=_ANSWERS,
            summary="The confirmation page of a one-click unsubscribe link (changes nothing)")
async def confirm(token: str, request: Request) -> HTMLResponse:
    try:
        claims = claims_of(app_state(request).unsubscribe_secrets, token)
    except InvalidToken as exc:
        return _invalid(exc)
    name, _, value = ONE_CLICK.partition("=")
    return _page(
        "Unsubscribe",
        f"<p>Stop sending <strong>{html.escape(claims.stream)}</strong> mail to "
        f"<strong>{html.escape(claims.address)}</strong>?</p>"
        f'<form method="post"><input type="hidden" name="{name}" value="{value}">'
        f'<button type="submit">Unsubscribe</button></form>')


@router.post(PATH + "{token}", response_class=HTMLResponse, responses=_ANSWERS,
             summary="One-click unsubscribe (RFC 8058): the token is the credential")
async def unsubscribe(token: str, request: Request) -> HTMLResponse:
    state = app_state(request)
    try:
        result = await one_click(state.require_store(), state.unsubscribe_secrets, token)
    except InvalidToken as exc:
        return _invalid(exc)
    claims = result.claims
    if result.first:
        log.info("one-click unsubscribe from %s (delivery %s)", claims.stream,
                 claims.delivery_id)
    return _page("You are unsubscribed",
                 f"<p>No more <strong>{html.escape(claims.stream)}</strong> mail will be sent "
                 f"to <strong>{html.escape(claims.address)}</strong>. Messages you asked "
                 "for (a password reset, a receipt) still arrive.</p>")
