"""Versioned templates, rendered once, at enqueue.

A template is a name with immutable versions (subject, text, html); editing it adds a version.
A message is rendered against the version current when it is enqueued, and the delivery keeps
the rendered content with ``template_id`` (the name) and ``template_version``: every attempt,
retry and replay sends exactly that, whatever happens to the template or the variables later.

Rendering is Jinja2 in a ``SandboxedEnvironment`` with ``StrictUndefined``: a variable the
template uses and the caller did not give is an error at enqueue (``TemplateError``), not a
blank in a sent message. The html part is autoescaped; subject and text are not.

::

    await add_template(store, "welcome", subject="Welcome, {{ name }}",
                       text="Hello {{ name }}, your account is ready.")
    await enqueue_template(store, "welcome", {"name": "Ada"},
                           key=f"welcome:{user_id}", to="ada@example.com")

    # in the caller's own transaction (the outbox), sqlite3 or psycopg:
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO users ...")
        enqueue_template_in_transaction(conn, "welcome", {"name": "Ada"}, key=..., to=...)

A template that deliveries may still send or replay from (pending, sending, ambiguous, open
dead letters) can be deprecated (no new enqueues) but not deleted.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, meta
from jinja2 import Template as JinjaTemplate
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import concat

from postlane.core.message import DEFAULT_LANE, EnqueueResult, Message
from postlane.core.records import TemplateVersion
from postlane.core.validation import check_subject, check_text
from postlane.errors import (
    InvalidHeader,
    InvalidMessage,
    TemplateDeprecated,
    TemplateError,
    TemplateInUse,
    UnknownTemplate,
)
from postlane.store.roles import TemplateStore

__all__ = [
    "CompiledTemplate",
    "Rendered",
    "TemplateVersion",
    "add_template",
    "check_name",
    "check_parts",
    "compile_template",
    "delete_template",
    "deprecate_template",
    "enqueue_template",
    "enqueue_template_in_transaction",
    "enqueue_template_in_transaction_async",
    "render_message",
    "render_message_in_transaction",
    "render_message_in_transaction_async",
    "require_usable",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PARTS = ("subject", "text", "html")


@dataclass(frozen=True, slots=True)
class Rendered:
    subject: str
    text: str | None
    html: str | None


class CompiledTemplate:
    """One template version, compiled once; renders many messages (an import: a million)."""

    def __init__(self, template: TemplateVersion, plain: SandboxedEnvironment,
                 html: SandboxedEnvironment) -> None:
        self.template = template
        self._parts: list[tuple[str, JinjaTemplate | None]] = []
        variables: set[str] = set()
        for part, source in zip(PARTS, (template.subject, template.text, template.html),
                                strict=True):
            if source is None:
                self._parts.append((part, None))
                continue
            env = html if part == "html" else plain
            try:
                variables |= meta.find_undeclared_variables(env.parse(source))
                self._parts.append((part, env.from_string(source)))
            except TemplateSyntaxError as exc:
                raise TemplateError(
                    f"template {template.name!r} {part}: syntax error on line {exc.lineno}: "
                    f"{exc.message}", field=part) from None
        self._globals = dict(plain.globals)
        self.variables = frozenset(variables)
        """The top-level variable names the template uses (some may sit in a branch)."""

    def render(self, variables: Mapping[str, Any]) -> Rendered:
        """Render every part; ``TemplateError`` names the part and the problem."""
        out: dict[str, str | None] = {}
        # The environment's globals (range, dict...) under the caller's variables, built once
        # for all parts: ``Template.render`` layers them per call, which is most of its cost
        # on a short template (an import renders a million).
        context = {**self._globals, **variables}
        for part, compiled in self._parts:
            if compiled is None:
                out[part] = None
                continue
            try:
                out[part] = concat(compiled.root_render_func(compiled.new_context(
                    context, shared=True)))
            except UndefinedError as exc:
                raise TemplateError(f"{self._where(part)}: {exc} (a variable the template "
                                    "uses was not given)", field="variables") from None
            except SecurityError as exc:
                raise TemplateError(f"{self._where(part)}: refused by the sandbox: {exc}",
                                    field=part) from None
            except Exception as exc:  # a filter or a test failing on this data
                raise TemplateError(f"{self._where(part)}: {type(exc).__name__}: {exc}",
                                    field=part) from None
        subject = out["subject"] or ""
        return Rendered(subject, out["text"], out["html"])

    def message(
        self, variables: Mapping[str, Any], *, key: str, to: str, lane: str = DEFAULT_LANE,
        sender: str | None = None, headers: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None, import_id: str | None = None,
        expires_at: datetime | None = None, expires_in: timedelta | None = None,
        delay: timedelta | None = None,
    ) -> Message:
        """A ``Message`` carrying this rendering, the template's name and version."""
        rendered = self.render(variables)
        return Message(
            key=key, to=to, subject=rendered.subject, text=rendered.text, html=rendered.html,
            lane=lane, sender=sender, headers=dict(headers or {}),
            metadata=dict(metadata or {}), import_id=import_id,
            template_id=self.template.name, template_version=self.template.version,
            expires_at=expires_at, expires_in=expires_in, delay=delay,
        )

    def _where(self, part: str) -> str:
        return f"template {self.template.name!r} v{self.template.version} {part}"


class _Compiler:
    """Two sandboxed environments (html autoescaped) and a small cache of compiled versions."""

    def __init__(self, size: int = 128) -> None:
        common: dict[str, Any] = {"undefined": StrictUndefined, "keep_trailing_newline": True}
        self.plain = SandboxedEnvironment(autoescape=False, **common)
        self.html = SandboxedEnvironment(autoescape=True, **common)
        self.size = size
        self._cache: OrderedDict[tuple[Any, ...], CompiledTemplate] = OrderedDict()

    def compile(self, template: TemplateVersion) -> CompiledTemplate:
        # Keyed by content too: two databases (or a deleted and re-created name) may hold
        # different texts under one (name, version).
        key = (template.name, template.version, template.subject, template.text,
               template.html)
        found = self._cache.get(key)
        if found is None:
            found = CompiledTemplate(template, self.plain, self.html)
            self._cache[key] = found
            if len(self._cache) > self.size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        # The cached object may carry an older deprecation flag; its texts are the same.
        return found if found.template == template else _rebind(found, template)


def _rebind(compiled: CompiledTemplate, template: TemplateVersion) -> CompiledTemplate:
    clone = object.__new__(CompiledTemplate)
    clone.__dict__.update(compiled.__dict__)
    clone.template = template
    return clone


_COMPILER = _Compiler()


def compile_template(template: TemplateVersion) -> CompiledTemplate:
    """The compiled form of ``template`` (cached); ``TemplateError`` on a syntax error."""
    return _COMPILER.compile(template)


def check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidMessage(
            f"template name {name!r} must be 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit", field="template_id")


def check_parts(subject: str, text: str | None, html: str | None) -> None:
    """Refuse, at creation, a template no message could be rendered from: a subject with a
    line break (every rendering of it would be refused at enqueue, every import row
    skipped), or a part no database column can hold."""
    try:
        check_subject(subject)
    except InvalidHeader as exc:
        raise TemplateError(f"template {exc}: a subject is one line, and every message "
                            "rendered from it would be refused", field="subject") from None
    for part, source in (("text", text), ("html", html)):
        if source is not None:
            check_text(source, field=part)


def require_usable(
    template: TemplateVersion | None, name: str, version: int | None
) -> TemplateVersion:
    """``template`` if it exists and takes new enqueues; else the matching error."""
    if template is None:
        which = f"{name!r} version {version}" if version is not None else repr(name)
        raise UnknownTemplate(f"unknown template {which}", field="template_id")
    if template.deprecated:
        raise TemplateDeprecated(
            f"template {name!r} is deprecated: it takes no new enqueues (messages already "
            "queued from it still send)", field="template_id")
    return template


# -- managing templates ------------------------------------------------------------------
async def add_template(
    store: TemplateStore, name: str, *, subject: str, text: str | None = None,
    html: str | None = None,
) -> TemplateVersion:
    """Store a new version of ``name`` (version 1 if it is new); its syntax is checked first."""
    check_name(name)
    if text is None and html is None:
        raise TemplateError("a template needs a text or an html body", field="text")
    check_parts(subject, text, html)
    probe = TemplateVersion(name, 0, subject, text, html, datetime.min, 0, False)
    CompiledTemplate(probe, _COMPILER.plain, _COMPILER.html)  # raises on a syntax error
    return await store.add_template_version(name, subject, text, html)


async def deprecate_template(store: TemplateStore, name: str, deprecated: bool = True) -> None:
    """Refuse (or, with ``deprecated=False``, allow again) new enqueues from ``name``."""
    if not await store.set_template_deprecated(name, deprecated):
        raise UnknownTemplate(f"unknown template {name!r}", field="template_id")


async def delete_template(store: TemplateStore, name: str) -> None:
    """Delete every version of ``name``; refused while deliveries reference it."""
    result = await store.delete_template_if_unreferenced(name)
    if not result.found:
        raise UnknownTemplate(f"unknown template {name!r}", field="template_id")
    if not result.deleted:
        n = result.references
        raise TemplateInUse(
            f"template {name!r} is still referenced by {n} deliver{'y' if n == 1 else 'ies'} "
            "(pending, sending, ambiguous or dead-lettered); deprecate it to stop new "
            "enqueues, and delete it once they are sent or their dead letters discarded",
            references=n)


# -- rendering and enqueueing through the store ------------------------------------------
async def render_message(
    store: TemplateStore, name: str, variables: Mapping[str, Any], *, key: str, to: str,
    version: int | None = None, **fields: Any,
) -> Message:
    """Render ``name`` (its current version, or ``version``) into a ``Message``.

    ``fields`` are the other ``Message`` fields: lane, sender, headers, metadata, import_id,
    expires_at, expires_in, delay. Raises ``UnknownTemplate``, ``TemplateDeprecated`` or
    ``TemplateError`` (a missing variable...); nothing is written.
    """
    template = require_usable(await store.get_template(name, version), name, version)
    return compile_template(template).message(variables, key=key, to=to, **fields)


async def enqueue_template(
    store: TemplateStore, name: str, variables: Mapping[str, Any], *, key: str, to: str,
    **fields: Any,
) -> EnqueueResult:
    """Render and enqueue in one step. The write re-checks, under a lock, that the template
    was not deleted or deprecated meanwhile. An existing key of the application's, for the
    same content (a rendering of another version counts as the same message), returns the
    existing delivery, rendered as it was then: the new rendering is discarded. Otherwise
    ``KeyConflict``."""
    message = await render_message(store, name, variables, key=key, to=to, **fields)
    return (await store.enqueue_many_if_template_usable(name, [message]))[0]


# -- the outbox form: inside the caller's transaction ------------------------------------
def render_message_in_transaction(
    conn: Any, name: str, variables: Mapping[str, Any], *, key: str, to: str,
    version: int | None = None, **fields: Any,
) -> Message:
    """``render_message`` through the caller's connection and transaction (any that
    ``postlane.enqueue`` takes, see ``postlane.store.connections``). On PostgreSQL the
    template row stays share-locked until that transaction ends, so it cannot be deleted or
    deprecated between this render and the caller's commit."""
    from postlane.store.connections import sync_writer

    found = sync_writer(conn).template(name, version)
    template = require_usable(found, name, version)
    return compile_template(template).message(variables, key=key, to=to, **fields)


def enqueue_template_in_transaction(
    conn: Any, name: str, variables: Mapping[str, Any], *, key: str, to: str, **fields: Any,
) -> EnqueueResult:
    """Render and ``postlane.enqueue`` in the caller's transaction; nothing is committed."""
    from postlane.outbox import enqueue

    return enqueue(conn, render_message_in_transaction(conn, name, variables, key=key, to=to,
                                                       **fields))


async def render_message_in_transaction_async(
    conn: Any, name: str, variables: Mapping[str, Any], *, key: str, to: str,
    version: int | None = None, **fields: Any,
) -> Message:
    """``render_message_in_transaction`` for an async connection (psycopg 3, asyncpg, or
    SQLAlchemy's async forms over either)."""
    from postlane.store.connections import async_writer

    found = await (await async_writer(conn)).template(name, version)
    template = require_usable(found, name, version)
    return compile_template(template).message(variables, key=key, to=to, **fields)


async def enqueue_template_in_transaction_async(
    conn: Any, name: str, variables: Mapping[str, Any], *, key: str, to: str, **fields: Any,
) -> EnqueueResult:
    from postlane.outbox import enqueue_async

    message = await render_message_in_transaction_async(conn, name, variables, key=key, to=to,
                                                        **fields)
    return await enqueue_async(conn, message)
