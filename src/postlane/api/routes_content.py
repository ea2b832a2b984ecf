"""``/v1/templates`` and ``/v1/imports``: thin shells over ``postlane.templates`` and
``postlane.imports``.

An import runs from the command line against a file (``postlane import``) or from a CSV
uploaded to ``POST /v1/imports/{id}``: the same ``postlane.imports.import_csv`` either way.
The API also shows import runs and their counters, and pauses or resumes them.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, File, Path, Query, Response, UploadFile
from pydantic import BaseModel, Field

from postlane.api.models import Strict, Text
from postlane.api.problems import ProblemError, not_found, problem_responses
from postlane.api.routes import Operator, Reader, StoreDep, known_query_only
from postlane.api.state import actor
from postlane.core.records import TemplateVersion
from postlane.errors import ImportRejected, UnknownTemplate
from postlane.imports import ImportStatus, import_csv, import_status
from postlane.imports import pause as pause_import
from postlane.imports import resume as resume_import
from postlane.templates import add_template, delete_template, deprecate_template

router = APIRouter(prefix="/v1", dependencies=[Depends(known_query_only)])

TemplateName = Annotated[str, Path(min_length=1, max_length=100,
                                   pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
                                   description="Letters, digits, '.', '_' or '-'.")]
ImportId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^:\x00-\x1f]+$",
                               description="The import's id.")]


# -- templates ---------------------------------------------------------------------------
class TemplateOut(BaseModel):
    name: str
    version: int
    latest_version: int
    deprecated: bool
    subject: str
    text: str | None
    html: str | None
    created_at: datetime

    @classmethod
    def of(cls, t: TemplateVersion) -> TemplateOut:
        return cls(name=t.name, version=t.version, latest_version=t.latest_version,
                   deprecated=t.deprecated, subject=t.subject, text=t.text, html=t.html,
                   created_at=t.created_at)


class TemplateList(BaseModel):
    templates: list[TemplateOut] = Field(description="The latest version of each, by name.")


class TemplateIn(Strict):
    """A new version: Jinja2 (sandboxed; a missing variable is an error at enqueue)."""

    subject: Text = Field(max_length=998)
    text: Text | None = None
    html: Text | None = None


class DeprecateIn(Strict):
    deprecated: bool = Field(default=True, description="False allows new enqueues again.")


@router.get("/templates", response_model=TemplateList, tags=["templates"],
            summary="Templates (latest versions)", responses=problem_responses(401, 403))
async def list_templates(store: StoreDep, _key: Reader) -> TemplateList:
    """Scope: `read`."""
    return TemplateList(templates=[TemplateOut.of(t) for t in await store.list_templates()])


@router.get("/templates/{name}", response_model=TemplateOut, tags=["templates"],
            summary="One version of a template", responses=problem_responses(401, 403, 404))
async def get_template(
    name: TemplateName, store: StoreDep, _key: Reader,
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1,
                                         description="Default: the latest.")] = None,
) -> TemplateOut:
    """Scope: `read`."""
    template = await store.get_template(name, version)
    if template is None:
        which = f"{name!r} version {version}" if version else repr(name)
        raise not_found(f"no template {which}")
    return TemplateOut.of(template)


@router.post("/templates/{name}", status_code=201, response_model=TemplateOut,
             tags=["templates"], summary="Add a version (the first one creates it)",
             responses=problem_responses(401, 403))
async def post_template(name: TemplateName, body: TemplateIn, store: StoreDep,
                        _key: Operator) -> TemplateOut:
    """Messages keep the version they were rendered with. A subject with a line break (any
    `str.splitlines` boundary) is refused (422): no message rendered from it could be
    sent. Scope: `operate`."""
    return TemplateOut.of(await add_template(store, name, subject=body.subject,
                                             text=body.text, html=body.html))


@router.post("/templates/{name}/deprecate", response_model=TemplateOut, tags=["templates"],
             summary="Stop (or allow again) new enqueues from a template",
             responses=problem_responses(401, 403, 404))
async def post_deprecate(name: TemplateName, store: StoreDep, _key: Operator,
                         body: DeprecateIn | None = None) -> TemplateOut:
    """Messages already queued from it still send. Scope: `operate`."""
    try:
        await deprecate_template(store, name, (body or DeprecateIn()).deprecated)
    except UnknownTemplate as exc:
        raise not_found(str(exc)) from None
    template = await store.get_template(name)
    if template is None:  # pragma: no cover - deleted in between
        raise not_found(f"no template {name!r}")
    return TemplateOut.of(template)


@router.delete("/templates/{name}", status_code=204, tags=["templates"],
               summary="Delete a template no delivery needs any more",
               responses=problem_responses(401, 403, 404, 409))
async def remove_template(name: TemplateName, store: StoreDep, _key: Operator) -> Response:
    """Refused (409) while pending, sending, ambiguous or dead-lettered deliveries
    reference it: deprecate it first. Scope: `operate`."""
    from postlane.errors import TemplateInUse

    try:
        await delete_template(store, name)
    except UnknownTemplate as exc:
        raise not_found(str(exc)) from None
    except TemplateInUse as exc:
        raise ProblemError(409, "template-in-use", "Template in use", str(exc)) from None
    return Response(status_code=204)


# -- imports -----------------------------------------------------------------------------
class ImportRows(BaseModel):
    read: int
    enqueued: int
    created: int
    skipped: int


class ImportDeliveries(BaseModel):
    created: int
    claimed: int
    accepted: int
    queued: int
    waiting_retry: int
    dead: int
    oldest_waiting_age_s: float
    states: dict[str, int]


class ImportCanaryOut(BaseModel):
    """The import's first deliveries, sent before the rest is released (docs/concepts.md)."""

    size: int
    state: str = Field(description="waiting, passed, failed (the import is paused) or "
                                   "released (by an operator).")
    reason: str | None
    deliveries: dict[str, int] = Field(description="The canary deliveries by state.")
    held: int = Field(description="The import's deliveries still held behind the canary.")
    settled_at: datetime | None


class ImportOut(BaseModel):
    import_id: str
    paused: bool
    paused_because: str | None = Field(default=None, description="Why it is paused, when "
                                                                  "the pause says (a failed "
                                                                  "canary does).")
    canary: ImportCanaryOut | None = None
    template: str | None = None
    template_version: int | None = None
    file: str | None = None
    lane: str | None = None
    runs: int | None = None
    started_at: datetime | None = None
    last_started_at: datetime | None = None
    finished_at: datetime | None = None
    rows: ImportRows | None = Field(default=None, description="The latest run's counters.")
    deliveries: ImportDeliveries

    @classmethod
    def of(cls, status: ImportStatus) -> ImportOut:
        r, c = status.record, status.counts
        deliveries = ImportDeliveries(
            created=c.created, claimed=c.states.get("sending", 0),
            accepted=c.states.get("sent", 0),
            queued=c.states.get("pending", 0) - c.waiting_retry,
            waiting_retry=c.waiting_retry, dead=c.states.get("dead", 0),
            oldest_waiting_age_s=round(c.oldest_waiting_age_s, 3), states=dict(c.states))
        canary = (ImportCanaryOut(**status.canary.as_json()) if status.canary is not None
                  else None)
        if r is None:
            return cls(import_id=status.import_id, paused=status.paused, deliveries=deliveries,
                       paused_because=status.paused_because, canary=canary)
        return cls(
            import_id=status.import_id, paused=status.paused,
            paused_because=status.paused_because, canary=canary, template=r.template,
            template_version=r.template_version, file=r.file_name, lane=r.lane, runs=r.runs,
            started_at=r.started_at, last_started_at=r.last_started_at,
            finished_at=r.finished_at,
            rows=ImportRows(read=r.rows_read, enqueued=r.rows_enqueued, created=r.rows_created,
                            skipped=r.rows_skipped),
            deliveries=deliveries)


class ImportList(BaseModel):
    imports: list[ImportOut] = Field(description="Most recently started first.")


class ImportControlOut(BaseModel):
    import_id: str
    paused: bool


@router.get("/imports", response_model=ImportList, tags=["imports"],
            summary="Import runs with their counters", responses=problem_responses(401, 403))
async def list_imports(store: StoreDep, _key: Reader,
                       limit: Annotated[int, Query(ge=1, le=200)] = 20) -> ImportList:
    """Scope: `read`."""
    found = []
    for record in await store.list_imports(limit=limit):
        status = await import_status(store, record.import_id)
        if status is not None:
            found.append(ImportOut.of(status))
    return ImportList(imports=found)


@router.get("/imports/{import_id}", response_model=ImportOut, tags=["imports"],
            summary="One import: its run and what became of its deliveries",
            responses=problem_responses(401, 403, 404))
async def get_import(import_id: ImportId, store: StoreDep, _key: Reader) -> ImportOut:
    """Scope: `read`."""
    status = await import_status(store, import_id)
    if status is None:
        raise not_found(f"no import {import_id!r}")
    return ImportOut.of(status)


@router.post("/imports/{import_id}/pause", response_model=ImportControlOut, tags=["imports"],
             summary="Pause an import on every worker", responses=problem_responses(401, 403))
async def post_pause_import(import_id: ImportId, store: StoreDep,
                            key: Operator) -> ImportControlOut:
    """Workers stop claiming its deliveries within a second; nothing is deleted.
    Scope: `operate`."""
    await pause_import(store, import_id, by=actor(key))
    return ImportControlOut(import_id=import_id, paused=True)


@router.post("/imports/{import_id}/resume", response_model=ImportControlOut, tags=["imports"],
             summary="Resume a paused import", responses=problem_responses(401, 403))
async def post_resume_import(import_id: ImportId, store: StoreDep,
                             _key: Operator) -> ImportControlOut:
    """Scope: `operate`."""
    await resume_import(store, import_id)
    return ImportControlOut(import_id=import_id, paused=False)


class ImportProblem(BaseModel):
    line: int
    reason: str


class ImportRunOut(BaseModel):
    import_id: str
    template: str
    template_version: int
    file: str
    rows_read: int
    rows_enqueued: int = Field(description="Rows written, or found already written by an "
                                           "earlier run of the same import.")
    rows_created: int
    rows_skipped: int
    problems: list[ImportProblem] = Field(description="The first skipped rows and why.")
    elapsed_s: float


@router.post("/imports/{import_id}", status_code=201, response_model=ImportRunOut,
             tags=["imports"], summary="Run an import from an uploaded CSV",
             responses=problem_responses(401, 403, 404, 413, 422))
async def post_import(
    import_id: ImportId, store: StoreDep, _key: Operator,
    file: Annotated[UploadFile, File(description="CSV with a header: user_id, email, and "
                                                 "the template's variables.")],
    template: Annotated[str, Query(min_length=1, max_length=100,
                                   pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")],
    strict: Annotated[bool, Query(description="Refuse the whole file if any row is bad "
                                              "(nothing is written).")] = False,
    canary: Annotated[int | None, Query(
        ge=1, description="Send the first N deliveries first and hold the rest until they "
                          "are sent; a canary delivery that dead-letters pauses the import "
                          "with the reason (GET /v1/imports/{import_id} shows it).")] = None,
) -> ImportRunOut:
    """One delivery per valid row into the bulk lane, keyed
    `<template>:<user_id>:<import_id>`: uploading the same file again (or the rest of it
    after a failure) creates nothing twice. The upload is spooled to a temporary file and
    streamed from there. A file with a NUL byte anywhere (UTF-16, or not text) is refused
    (422) before a row is written. Scope: `operate`."""
    with tempfile.NamedTemporaryFile(suffix=".csv", prefix="postlane-import-") as spool:
        await asyncio.to_thread(shutil.copyfileobj, file.file, spool, 1024 * 1024)
        spool.flush()
        try:
            report = await import_csv(store, spool.name, template=template,
                                      import_id=import_id, strict=strict, canary=canary)
        except ImportRejected as exc:
            problems = exc.problems
            detail = str(exc)
            if problems:
                detail += "; " + "; ".join(f"line {line}: {why}" for line, why in problems[:20])
            raise ProblemError(422, "import-rejected", "Import refused", detail) from None
        except UnknownTemplate as exc:
            raise not_found(str(exc)) from None
    data = report.as_json()
    data["file"] = file.filename or data["file"]
    return ImportRunOut(**data)
