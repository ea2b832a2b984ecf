"""Authenticate and authorise before a byte of the body is read.

FastAPI reads (and, for a form, spools) a request's body before it runs the route's
dependencies, the API key check among them: an upload without a valid key was read whole,
hundreds of megabytes, and only then refused with 401. ``AuthFirst`` runs first: for a
``/v1`` route whose dependencies ``require`` a scope, it checks the ``Authorization`` header
(401 without a valid key, 403 without the scope) before the route, and so its body, is
reached. The key it checked is left in the request's state for ``require`` to take, so a
request costs one look-up. Routes without a scope (provider webhooks, verified by
signature) are passed on as they are.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi.dependencies.models import Dependant
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from postlane.api.problems import TYPE_BASE, ProblemError, problem_response
from postlane.api.state import CHECKED_KEY, AppState, check_key

log = logging.getLogger("postlane.api")

PREFIX = "/v1/"


def required_scope(dependant: Dependant | None) -> str | None:
    """The scope a route's dependencies ``require``, if any."""
    if dependant is None:
        return None
    for dependency in dependant.dependencies:
        scope = getattr(dependency.call, "postlane_scope", None) or required_scope(dependency)
        if scope:
            return str(scope)
    return None


class AuthFirst:
    """``routes``: the API's own routes (those of its ``APIRouter``s, each with its full
    path), matched as the app would match them."""

    def __init__(self, app: ASGIApp, state: AppState, routes: list[BaseRoute]) -> None:
        self.app = app
        self.state = state
        self.routes = routes

    def _scope_for(self, scope: Scope) -> str | None:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return required_scope(getattr(route, "dependant", None))
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or not str(scope.get("path", "")).startswith(PREFIX)
                or self.state.store is None):
            await self.app(scope, receive, send)
            return
        needed = self._scope_for(scope)
        if needed is None:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        try:
            key = await check_key(self.state.store, token, needed)
        except ProblemError as exc:
            response = problem_response(exc.status, TYPE_BASE + exc.name,
                                        exc.title, exc.detail, headers=exc.headers)
            await response(scope, receive, send)
            return
        except Exception:  # the database: let the route fail the same way and say so
            log.debug("API key check before the body failed; the route checks again",
                      exc_info=True)
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        state[CHECKED_KEY] = key
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text: str = bytes(value).decode("latin-1")
            scheme, _, credentials = text.partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
            return None
    return None
