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

Attachments are declared by the application for a template name, and rendered per message
(each row of an import too) from the same variables: a static file read once at declaration,
or a callback producing the bytes (a receipt's PDF). Their filenames are templates too::

    declare_attachments("receipt",
                        static_file("static/logo.png", content_id="logo"),
                        rendered("receipt-{{ order_id }}.pdf", make_pdf, "application/pdf"))

The rendered bytes are stored with each delivery (``postlane.core.attachments``).
"""

from __future__ import annotations

import mimetypes
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, meta, nodes
from jinja2 import Template as JinjaTemplate
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.runtime import new_context
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import concat
from markupsafe import escape

from postlane.core.attachments import ATTACHMENT, INLINE, Attachment
from postlane.core.message import DEFAULT_LANE, EnqueueResult, Message
from postlane.core.records import TemplateVersion, refuse_unusable_template
from postlane.core.validation import check_subject, check_text
from postlane.errors import (
    InvalidHeader,
    InvalidMessage,
    TemplateError,
    TemplateInUse,
    UnknownTemplate,
)
from postlane.store.roles import TemplateStore

__all__ = [
    "CompiledTemplate",
    "Rendered",
    "TemplateAttachment",
    "TemplateVersion",
    "add_template",
    "check_name",
    "check_parts",
    "compile_template",
    "declare_attachments",
    "declared_attachments",
    "delete_template",
    "deprecate_template",
    "enqueue_template",
    "enqueue_template_in_transaction",
    "enqueue_template_in_transaction_async",
    "render_message",
    "render_message_in_transaction",
    "render_message_in_transaction_async",
    "rendered",
    "require_usable",
    "static_file",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PARTS = ("subject", "text", "html")


@dataclass(frozen=True, slots=True)
class Rendered:
    subject: str
    text: str | None
    html: str | None


@dataclass(frozen=True, slots=True)
class TemplateAttachment:
    """A part a template declares, made per message from its variables: ``content`` (a
    static file's bytes) or ``render(variables) -> bytes``; ``filename`` is a template."""

    filename: str
    content_type: str
    content: bytes | None = None
    render: Callable[[Mapping[str, Any]], bytes] | None = None
    kind: str = ATTACHMENT
    content_id: str | None = None


def static_file(path: str | Path, *, filename: str | None = None,
                content_type: str | None = None,
                content_id: str | None = None) -> TemplateAttachment:
    """A file read now, once (a logo, terms and conditions), attached to every message of
    the template; with ``content_id`` an inline part the HTML names as ``cid:``."""
    source = Path(path)
    try:
        content = source.read_bytes()
    except OSError as exc:
        raise TemplateError(f"attachment {str(source)!r}: {exc.strerror or exc}",
                            field="attachments") from None
    kind = INLINE if content_id else ATTACHMENT
    guessed = mimetypes.guess_type(source.name)[0] or "application/octet-stream"
    return TemplateAttachment(filename or source.name, content_type or guessed, content,
                              kind=kind, content_id=content_id)


def rendered(filename: str, render: Callable[[Mapping[str, Any]], bytes],
             content_type: str = "application/octet-stream") -> TemplateAttachment:
    """A part the application produces per message: ``render(variables)`` returns its bytes
    (an invoice PDF, a QR code); ``filename`` may use the variables (``{{ order_id }}``)."""
    return TemplateAttachment(filename, content_type, render=render)


_DECLARED: dict[str, tuple[TemplateAttachment, ...]] = {}


def declare_attachments(template: str, *parts: TemplateAttachment) -> None:
    """Declare the parts every message rendered from ``template`` carries (in this process:
    the application's, or ``postlane import --attachments MODULE`` that imports a module
    declaring them). Declaring again replaces; no parts removes the declaration."""
    check_name(template)
    if parts:
        _DECLARED[template] = tuple(parts)
    else:
        _DECLARED.pop(template, None)


def declared_attachments(template: str) -> tuple[TemplateAttachment, ...]:
    return _DECLARED.get(template, ())


class CompiledTemplate:
    """One template version, compiled once; renders many messages (an import: a million)."""

    def __init__(self, template: TemplateVersion, plain: SandboxedEnvironment,
                 html: SandboxedEnvironment) -> None:
        self.template = template
        self._parts: list[tuple[str, JinjaTemplate | None]] = []
        variables: set[str] = set()
        substitutions: list[tuple[str, bool, str, tuple[str, ...]]] | None = []
        for part, source in zip(PARTS, (template.subject, template.text, template.html),
                                strict=True):
            if source is None:
                self._parts.append((part, None))
                continue
            env = html if part == "html" else plain
            try:
                tree = env.parse(source)
                used = meta.find_undeclared_variables(tree)
                variables |= used
                self._parts.append((part, env.from_string(source)))
            except TemplateSyntaxError as exc:
                raise TemplateError(
                    f"template {template.name!r} {part}: syntax error on line {exc.lineno}: "
                    f"{exc.message}", field=part) from None
            if substitutions is not None:
                found = _substitution(tree, used)
                substitutions = (None if found is None
                                 else [*substitutions, (part, part == "html", *found)])
        self._globals = dict(plain.globals)
        self.variables = frozenset(variables)
        """The top-level variable names the template uses (some may sit in a branch)."""
        self._substitutions = substitutions
        """Each part as a ``%`` format and the variables it takes, when every part is only
        text and ``{{ name }}`` (see ``_substitution``); None otherwise."""

    def render(self, variables: Mapping[str, Any]) -> Rendered:
        """Render every part; ``TemplateError`` names the part and the problem."""
        if self._substitutions is not None:
            fast = self._substitute(variables)
            if fast is not None:
                return fast
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
                # ``Template.new_context`` with the globals as a dict: the context only takes
                # their names, and a set of the template's ``ChainMap`` of them was half its
                # cost.
                out[part] = concat(compiled.root_render_func(new_context(
                    compiled.environment, compiled.name, compiled.blocks, context, True,
                    self._globals)))
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

    def _substitute(self, variables: Mapping[str, Any]) -> Rendered | None:
        """The rendering of a template of text and ``{{ name }}`` only, as Jinja makes it
        (the value, ``escape``d in html), without a Jinja context per part: most of a short
        template's cost (an import renders a million). None, for Jinja to render (and
        report), when a variable is missing or is not a plain ``str``, or the variables are
        not a plain ``dict``."""
        assert self._substitutions is not None
        if type(variables) is not dict:  # a defaultdict, or a Mapping of its own: as Jinja sees it
            return None
        for name in self.variables:
            if type(variables.get(name)) is not str:
                return None
        out: dict[str, str | None] = {"subject": None, "text": None, "html": None}
        for part, escaped, form, names in self._substitutions:
            if not names:
                out[part] = form
            elif escaped and _HTML_SPECIAL.search("".join(map(variables.__getitem__, names))):
                out[part] = form % {name: escape(variables[name]) for name in names}
            else:  # no value holds a character html escapes
                out[part] = form % variables
        return Rendered(out["subject"] or "", out["text"], out["html"])

    def message(
        self, variables: Mapping[str, Any], *, key: str, to: str, lane: str = DEFAULT_LANE,
        sender: str | None = None, headers: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None, import_id: str | None = None,
        expires_at: datetime | None = None, expires_in: timedelta | None = None,
        delay: timedelta | None = None, attachments: Sequence[Attachment] = (),
    ) -> Message:
        """A ``Message`` carrying this rendering, the template's name and version, and the
        template's declared parts rendered from ``variables`` after ``attachments``."""
        out = self.render(variables)
        return Message(
            key=key, to=to, subject=out.subject, text=out.text, html=out.html,
            lane=lane, sender=sender, headers=dict(headers or {}),
            metadata=dict(metadata or {}), import_id=import_id,
            template_id=self.template.name, template_version=self.template.version,
            expires_at=expires_at, expires_in=expires_in, delay=delay,
            attachments=(*attachments, *self.render_attachments(variables)),
        )

    def render_attachments(self, variables: Mapping[str, Any]) -> tuple[Attachment, ...]:
        """The declared parts for one message; ``TemplateError`` names the one that failed."""
        parts = []
        for declared in declared_attachments(self.template.name):
            where = f"{self._where('attachments')} {declared.filename!r}"
            try:
                filename = _COMPILER.filename(declared.filename).render(variables)
                content = (declared.content if declared.render is None
                           else declared.render(variables))
            except UndefinedError as exc:
                raise TemplateError(f"{where}: {exc} (a variable the attachment uses was not "
                                    "given)", field="variables") from None
            except Exception as exc:  # the application's callback failed on this data
                raise TemplateError(f"{where}: {type(exc).__name__}: {exc}",
                                    field="attachments") from None
            if not isinstance(content, bytes):
                raise TemplateError(f"{where}: the callback returned "
                                    f"{type(content).__name__}, not bytes",
                                    field="attachments")
            parts.append(Attachment(filename, content, declared.content_type, declared.kind,
                                    declared.content_id))
        return tuple(parts)

    def _where(self, part: str) -> str:
        return f"template {self.template.name!r} v{self.template.version} {part}"


def _substitution(tree: nodes.Template,
                  used: Collection[str]) -> tuple[str, tuple[str, ...]] | None:
    """A part that is only text and ``{{ name }}`` of variables the context gives, as a
    ``%(name)s`` format and the names it takes; None for anything else (a filter, a tag,
    ``self``). Jinja's code for such a part yields the text and ``str(value)``
    (``escape(value)`` with autoescape) of each, which is what the format gives for ``str``
    values."""
    form: list[str] = []
    for node in tree.body:
        if type(node) is not nodes.Output:
            return None
        for child in node.nodes:
            if type(child) is nodes.TemplateData:
                form.append(child.data.replace("%", "%%"))
            elif type(child) is nodes.Name and child.ctx == "load" and child.name in used:
                form.append(f"%({child.name})s")
            else:
                return None
    names = tuple(sorted(used)) if any(f.startswith("%(") for f in form) else ()
    return "".join(form), names


_HTML_SPECIAL = re.compile("[&<>'\"]")
"""What ``markupsafe.escape`` replaces in a ``str``."""


class _Compiler:
    """Two sandboxed environments (html autoescaped) and a small cache of compiled versions."""

    def __init__(self, size: int = 128) -> None:
        common: dict[str, Any] = {"undefined": StrictUndefined, "keep_trailing_newline": True}
        self.plain = SandboxedEnvironment(autoescape=False, **common)
        self.html = SandboxedEnvironment(autoescape=True, **common)
        self.size = size
        self._cache: OrderedDict[tuple[Any, ...], CompiledTemplate] = OrderedDict()
        self._filenames: dict[tuple[str, str], JinjaTemplate] = {}

    def filename(self, source: str) -> JinjaTemplate:
        """A declared attachment's filename template, compiled once."""
        key = ("filename", source)
        found = self._filenames.get(key)
        if found is None:
            found = self._filenames[key] = self.plain.from_string(source)
        return found

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
    refuse_unusable_template(name, version, None if template is None else template.deprecated)
    assert template is not None  # refused above
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
