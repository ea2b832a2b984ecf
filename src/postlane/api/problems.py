"""Errors as problem details (RFC 9457): ``application/problem+json`` with a specific message.

Every error the API answers with has ``type`` (a URI naming the kind of problem), ``title``
(the same for every occurrence of that type), ``status`` and ``detail`` (this occurrence, in
words an operator can act on). Validation errors add ``field`` (from
``postlane.errors.InvalidMessage``) or ``errors`` (one per invalid part of the request).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from postlane.errors import (
    InvalidMessage,
    KeyConflict,
    MigrationRequired,
    ReplayRefused,
    StoreError,
    StoreUnavailable,
)

log = logging.getLogger("postlane.api")

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "urn:postlane:problem:"


class FieldError(BaseModel):
    location: str = Field(description="Where: `body.to`, `query.limit`, `header.idempotency-key`.")
    message: str


class Problem(BaseModel):
    """An error, as RFC 9457 problem details."""

    type: str = Field(description="A URI naming the kind of problem "
                                  "(`urn:postlane:problem:<name>`, or `about:blank`).")
    title: str = Field(description="A short summary, the same for every problem of this type.")
    status: int = Field(description="The HTTP status code.")
    detail: str = Field(description="What went wrong this time, specifically.")
    field: str | None = Field(default=None, description="The message field at fault, when one is.")
    errors: list[FieldError] | None = Field(
        default=None, description="Every invalid part of the request, for validation errors.")
    preview: dict[str, Any] | None = Field(
        default=None, description="A bulk action refused for want of confirmation: the "
                                  "selection as counted now (`matched`, `upto_id`); confirm "
                                  "with those as `expected` and `upto_id`.")


class ProblemError(Exception):
    """Raised by routes; answered as problem details."""

    def __init__(self, status: int, name: str, title: str, detail: str, *,
                 field: str | None = None, errors: Sequence[FieldError] | None = None,
                 headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.extra = extra
        self.status = status
        self.name = name
        self.title = title
        self.detail = detail
        self.field = field
        self.errors = list(errors) if errors is not None else None
        self.headers = headers


def problem_response(status: int, type_: str, title: str, detail: str, *,
                     field: str | None = None, errors: Sequence[FieldError] | None = None,
                     headers: dict[str, str] | None = None,
                     extra: dict[str, Any] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"type": type_, "title": title, "status": status, "detail": detail}
    body.update(extra or {})
    if field is not None:
        body["field"] = field
    if errors is not None:
        body["errors"] = [e.model_dump() for e in errors]
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def body_too_large(detail: str) -> JSONResponse:
    return problem_response(413, TYPE_BASE + "body-too-large", "Body too large", detail,
                            headers={"Connection": "close"})


def not_found(detail: str) -> ProblemError:
    return ProblemError(404, "not-found", "Not found", detail)


def unauthorized(detail: str) -> ProblemError:
    return ProblemError(401, "unauthorized", "Authentication required", detail,
                        headers={"WWW-Authenticate": 'Bearer realm="postlane"'})


def forbidden(detail: str) -> ProblemError:
    return ProblemError(403, "forbidden", "Missing scope", detail)


# -- OpenAPI: the error responses each route declares ------------------------------------
DESCRIPTIONS = {
    400: "The request is malformed (not JSON, or a required header is missing).",
    401: "No API key, or an unknown or revoked one.",
    403: "The API key lacks the scope this route needs.",
    404: "Nothing with that id.",
    409: "The operation conflicts with the current state (e.g. a replay whose canary was "
         "not sent yet).",
    413: "The request body is over the size limit.",
    422: "The request is well-formed but invalid; `field` or `errors` says where.",
    503: "The database is unreachable or its schema is not migrated.",
}


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each code answered with a ``Problem``."""
    return {code: {"model": Problem, "description": DESCRIPTIONS[code]} for code in codes}


def complete_error_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """Make the document say what the app does on errors, for every operation:

    - errors are ``application/problem+json`` (FastAPI documents every model as JSON),
      except where a route declares an HTML page (``/unsubscribe/{token}``);
    - a request body can be malformed (400), too large (413) or invalid (422);
    - parameters can be invalid (422): a ``Problem``, not FastAPI's ``HTTPValidationError``;
    - any operation can find the database unavailable (503);
    - an optional parameter is absent, never ``null``: a query string has no null (FastAPI
      documents ``str | None`` as ``anyOf: [string, null]``).
    """
    problem = {"$ref": "#/components/schemas/Problem"}
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                _drop_null(parameter.get("schema", {}))
            responses = operation.setdefault("responses", {})
            codes = [] if path == "/healthz" else ["503"]
            if "requestBody" in operation:
                codes += ["400", "413", "422"]
            if operation.get("parameters"):
                codes.append("422")
            for code in codes:
                responses.setdefault(code, {"description": DESCRIPTIONS[int(code)]})
            for code, response in responses.items():
                if code[:1] not in "45" or "text/html" in response.get("content", {}):
                    continue  # a page for a person (the unsubscribe link) stays a page
                response["content"] = {MEDIA_TYPE: {"schema": problem}}
                if response.get("description") in ("Validation Error", None):
                    response["description"] = DESCRIPTIONS.get(int(code), "An error.")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return schema


def _drop_null(schema: dict[str, Any]) -> None:
    variants = schema.get("anyOf")
    if isinstance(variants, list) and {"type": "null"} in variants:
        rest = [v for v in variants if v != {"type": "null"}]
        del schema["anyOf"]
        if len(rest) == 1:
            schema.update(rest[0])
        else:
            schema["anyOf"] = rest


# -- handlers ----------------------------------------------------------------------------
def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers at this path."""
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        route_methods = getattr(route, "methods", None)
        if match is not Match.NONE and route_methods:
            methods |= set(route_methods)
    return sorted(methods)


def _location(loc: Iterable[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] == "header" and len(parts) > 1:
        parts[1] = parts[1].replace("_", "-")
    return ".".join(parts)


def install(app: FastAPI) -> None:
    """Answer every error as problem details."""

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(exc.status, TYPE_BASE + exc.name, exc.title, exc.detail,
                                field=exc.field, errors=exc.errors, headers=exc.headers,
                                extra=exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        raw = list(exc.errors())
        errors = [FieldError(location=_location(e.get("loc", ())), message=str(e.get("msg")))
                  for e in raw]
        if any(e.get("type") == "json_invalid" for e in raw):
            first = next(e for e in raw if e.get("type") == "json_invalid")
            where = first.get("ctx", {}).get("error", "")
            return problem_response(400, TYPE_BASE + "malformed-body", "Malformed body",
                                    f"the body is not valid JSON ({where})" if where
                                    else "the body is not valid JSON", errors=errors)
        missing_headers = [e for e in raw if e.get("type") == "missing"
                           and tuple(e.get("loc", ()))[:1] == ("header",)]
        if missing_headers:
            name = _location(missing_headers[0]["loc"]).removeprefix("header.")
            return problem_response(400, TYPE_BASE + "missing-header", "Missing header",
                                    f"the {name} header is required", errors=errors)
        first_error = errors[0] if errors else None
        detail = (f"{first_error.location}: {first_error.message}" if first_error
                  else "the request is invalid")
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more)"
        return problem_response(422, TYPE_BASE + "invalid-request", "Invalid request", detail,
                                errors=errors)

    @app.exception_handler(InvalidMessage)
    async def _invalid_message(request: Request, exc: InvalidMessage) -> JSONResponse:
        return problem_response(422, TYPE_BASE + "invalid-message", "Invalid message",
                                str(exc), field=exc.field)

    @app.exception_handler(KeyConflict)
    async def _key_conflict(request: Request, exc: KeyConflict) -> JSONResponse:
        return problem_response(409, TYPE_BASE + "key-conflict", "Key conflict", str(exc))

    @app.exception_handler(ReplayRefused)
    async def _replay_refused(request: Request, exc: ReplayRefused) -> JSONResponse:
        return problem_response(409, TYPE_BASE + "replay-refused", "Replay refused", str(exc))

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        driver = exc.__cause__
        if isinstance(exc, StoreUnavailable) and driver is not None:
            log.error("database error on %s: %s", where, exc)
            return problem_response(503, TYPE_BASE + "store-unavailable", "Database unavailable",
                                    f"the database did not answer: {type(driver).__name__}")
        if driver is not None and not isinstance(exc, StoreUnavailable | MigrationRequired):
            # The database refused in a way no operation expects (a bug, not an outage):
            # answered as any unexpected error is, not as "try again later".
            log.error("unexpected database error on %s", where, exc_info=exc)
            return problem_response(500, TYPE_BASE + "internal", "Internal error",
                                    f"an unexpected {type(driver).__name__}; see the server log")
        log.error("store error on %s: %s", where, exc)
        title = ("Database not migrated" if isinstance(exc, MigrationRequired)
                 else "Database unavailable")
        return problem_response(503, TYPE_BASE + "store-unavailable", title, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 413:
            return body_too_large(str(exc.detail))
        phrase = HTTPStatus(exc.status_code).phrase
        headers = dict(getattr(exc, "headers", None) or {})
        detail = exc.detail if isinstance(exc.detail, str) and exc.detail != phrase else phrase
        if exc.status_code == 404 and detail == phrase:
            detail = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            # Starlette names only the methods of the first route matching the path.
            allowed = allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            detail = (f"{request.method} is not allowed on {request.url.path} "
                      f"(allowed: {', '.join(allowed)})")
        return problem_response(exc.status_code, "about:blank", phrase, detail,
                                headers=headers or None)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return problem_response(500, TYPE_BASE + "internal", "Internal error",
                                f"an unexpected {type(exc).__name__}; see the server log")
