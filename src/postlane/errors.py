"""Postlane's exceptions, split by what the caller can do about them.

    PostlaneError
    ├── InvalidMessage            bad input at enqueue; nothing was written
    │   ├── InvalidAddress
    │   ├── InvalidHeader
    │   ├── UnknownLane
    │   ├── InvalidKey
    │   └── ContentTooLarge
    ├── ConfigurationError        a bad URL, option or lane table
    ├── StoreError                the database said no in a way Postlane does not expect
    │   └── MigrationRequired     the schema is older than this version of Postlane
    ├── UnsupportedConnection     enqueue() was handed a connection it cannot write through
    └── ReplayRefused             a dead-letter replay failed a check (expired, no canary yet)

Errors that concern a *send* (retry, stop, or reconcile) are not exceptions: a provider
adapter turns them into an outcome class, see ``postlane.core.outcomes``.
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


class UnknownLane(InvalidMessage):
    """The message names a lane that is not configured."""


class InvalidKey(InvalidMessage):
    """The idempotency key is empty, too long or contains control characters."""


class ContentTooLarge(InvalidMessage):
    """The rendered content is over the configured size limit."""


class ConfigurationError(PostlaneError, ValueError):
    """A URL, option or setting cannot be used as given."""


class StoreError(PostlaneError):
    """The store failed in a way the caller cannot fix by changing its input."""


class MigrationRequired(StoreError):
    """The database schema is missing or older than this Postlane; run ``postlane migrate``."""


class UnsupportedConnection(PostlaneError, TypeError):
    """``enqueue`` accepts psycopg 3, sqlite3 and SQLAlchemy connections only."""


class ReplayRefused(PostlaneError):
    """A dead-letter replay failed one of its checks: still useful? cause fixed (canary)?"""
