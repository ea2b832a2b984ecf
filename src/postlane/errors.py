"""Postlane's exceptions, split by what the caller can do about them.

    PostlaneError
    ├── InvalidMessage            bad input at enqueue; nothing was written
    │   ├── InvalidAddress
    │   ├── InvalidHeader
    │   ├── InvalidText           a NUL or a lone surrogate: no database column holds it
    │   ├── InvalidMetadata       metadata that is not a JSON object (or nested too deep)
    │   ├── UnknownLane
    │   ├── InvalidKey
    │   ├── InvalidTime           a time no store can read back (naive, out of range)
    │   ├── ContentTooLarge
    │   ├── InvalidAttachment     a part that could not be sent as given (no name, bad type)
    │   ├── UnknownTemplate       no such template (or version)
    │   ├── TemplateDeprecated    the template takes no new enqueues
    │   ├── TemplateError         a template failed to render (a missing variable...)
    │   └── MissingSender         no sender on the message nor on the provider: the
    │                             adapter answers an account-level outcome, not a dead letter
    ├── ConfigurationError        a bad URL, option or lane table
    ├── MissingExtra              a feature needs an optional package: pip install 'postlane[x]'
    ├── StoreError                the database said no in a way Postlane does not expect
    │   ├── StoreUnavailable      it could not be reached, timed out or was busy: try later
    │   ├── StoreConflict         a write met a unique key another writer holds
    │   └── MigrationRequired     the schema is older than this version of Postlane
    ├── UnsupportedConnection     enqueue() was handed a connection it cannot write through
    ├── KeyConflict               the key belongs to another producer, or to other content
    ├── ReplayRefused             a dead-letter replay failed a check (expired, no canary yet)
    ├── TemplateInUse             delete refused: deliveries still reference the template
    └── ImportRejected            a bulk import stopped before writing (strict mode, bad file)

Errors that concern a *send* (retry, stop, or reconcile) are not exceptions: a provider
adapter turns them into an outcome class, see ``postlane.core.outcomes``.

Nothing above the store sees a database driver's exception: each engine translates
psycopg's and sqlite3's at its seam (``postlane.store.seam``) into the ``StoreError``
branch, the original kept as ``__cause__``.
"""

from __future__ import annotations


class PostlaneError(Exception):
    """Base class of every error Postlane raises on purpose."""


class InvalidMessage(PostlaneError, ValueError):
    """The send intent is malformed; it was refused before anything was written."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidAddress(InvalidMessage):
    """The recipient (or sender) is not a syntactically valid address."""


class InvalidHeader(InvalidMessage):
    """A header name or value would corrupt the message on the wire (CR/LF, bad name)."""


class InvalidText(InvalidMessage):
    """A text holds a NUL character (PostgreSQL refuses it in text and jsonb) or a lone
    surrogate (it has no UTF-8 form): it could be neither stored nor sent."""


class InvalidMetadata(InvalidMessage):
    """Metadata is not a JSON object both engines store alike: a non-string key, NaN or
    infinity, a value JSON has no form for, or nesting deeper than the documented limit."""


class UnknownLane(InvalidMessage):
    """The message names a lane that is not configured."""


class InvalidKey(InvalidMessage):
    """The idempotency key is empty, too long or contains control characters."""


class InvalidTime(InvalidMessage):
    """A time (``expires_at``) or span (``expires_in``, ``delay``) that is naive, or that
    lands outside the range both stores can read back: stored, it could never be sent."""


class ContentTooLarge(InvalidMessage):
    """The rendered content is over the configured size limit."""


class InvalidAttachment(InvalidMessage):
    """An attachment, inline part or calendar invite that could not be sent as given."""


class ConfigurationError(PostlaneError, ValueError):
    """A URL, option or setting cannot be used as given."""


class MissingExtra(PostlaneError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the
    extra that installs it. (An ``ImportError`` too, so code that tolerates a missing optional
    package keeps working.)"""

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class StoreError(PostlaneError):
    """The store failed in a way the caller cannot fix by changing its input."""


class StoreUnavailable(StoreError):
    """The database could not be reached, or gave up on the operation: a refused or dropped
    connection, a pool or lock timeout, a busy SQLite file, a deadlock. Nothing Postlane
    asked for was committed; the same call may succeed later (the API answers 503)."""


class StoreConflict(StoreError):
    """A write met a unique key that another writer holds (a row inserted concurrently).
    The store's own operations absorb the conflicts they expect (an idempotency key
    enqueued twice); this one they did not."""


class MigrationRequired(StoreError):
    """The database schema is missing or older than this Postlane; run ``postlane migrate``."""


class UnsupportedConnection(PostlaneError, TypeError):
    """``enqueue`` was handed an object it cannot write through, or a sync connection was
    handed to ``enqueue_async`` (or the reverse); see ``postlane.store.connections``."""


class KeyConflict(PostlaneError):
    """An enqueue found its idempotency key already written by another producer (another
    API client, the application, an import), or by the same producer for other content.
    Nothing is returned for a key the caller does not own; in the caller's own transaction
    (the outbox) roll it back, as after any error.

    ``conflicts`` lists ``(key, delivery id, reason)`` for every such key of the call (a
    batch may have several); ``key`` and ``delivery_id`` are the first's."""

    def __init__(self, message: str, *, conflicts: list[tuple[str, int, str]]) -> None:
        super().__init__(message)
        self.conflicts = conflicts
        self.key, self.delivery_id = conflicts[0][0], conflicts[0][1]

    @classmethod
    def of(cls, conflicts: list[tuple[str, int, str]]) -> KeyConflict:
        more = f" (and {len(conflicts) - 1} more key(s))" if len(conflicts) > 1 else ""
        return cls(conflicts[0][2] + more, conflicts=conflicts)


class ReplayRefused(PostlaneError):
    """A dead-letter replay failed one of its checks: still useful? cause fixed (canary)?"""


class UnknownTemplate(InvalidMessage):
    """The message names a template (or a version of one) that does not exist."""


class TemplateDeprecated(InvalidMessage):
    """The template is deprecated: it renders no new messages (queued ones still send)."""


class TemplateError(InvalidMessage):
    """The template failed to render for these variables: an undefined variable, a bad
    filter, a construct the sandbox forbids, or a syntax error in a new version."""


class MissingSender(InvalidMessage):
    """Neither the message nor the provider names a sender. Raised when the adapter builds
    the request; it is the deployment's configuration (``from=`` on the provider URL), not
    the message, so the send maps to an account-level outcome and waits, unspent."""


class TemplateInUse(PostlaneError):
    """Deleting the template was refused: deliveries that may still be sent (pending,
    sending, ambiguous) or replayed (open dead letters) reference it."""

    def __init__(self, message: str, *, references: int) -> None:
        super().__init__(message)
        self.references = references


class ImportRejected(PostlaneError, ValueError):
    """A bulk import was refused before anything was written: a bad header, an unusable
    template, or (with ``strict``) any bad row. ``problems`` are ``(line, reason)`` pairs."""

    def __init__(self, message: str, *, problems: list[tuple[int, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []
