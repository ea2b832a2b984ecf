"""Errors stop at the seam: a driver's exception never leaves a store operation.

Each engine says once how its driver's exceptions read as Postlane's (a context manager in
its ``_base`` module, like httpx's ``map_httpcore_exceptions``), and ``translated`` puts
it around every operation of ``Store``. So the API, the CLI and the worker catch
``StoreUnavailable`` (try later), ``StoreConflict`` or ``StoreError`` and import neither
psycopg nor sqlite3; the driver's exception stays as ``__cause__`` for the log.

The outbox functions (``postlane.store.connections``) are not operations of a store: they
write through the application's own connection, inside its transaction, and leave its
driver's exceptions to it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from postlane.store.base import Store

S = TypeVar("S", bound=type[Store])
ErrorMap = Callable[[], AbstractContextManager[None]]


def translated(errors: ErrorMap) -> Callable[[S], S]:
    """A class decorator for an engine: every operation of ``Store`` runs inside
    ``errors()``. A Postlane error passes through it unchanged (an operation may call
    another), so nesting is harmless."""

    def apply(cls: S) -> S:
        for name in sorted(Store.__abstractmethods__):
            method = getattr(cls, name)
            if inspect.iscoroutinefunction(method):
                setattr(cls, name, _inside(errors, method))
        return cls

    return apply


def _inside(errors: ErrorMap, method: Callable[..., Awaitable[Any]]
            ) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def operation(*args: Any, **kwargs: Any) -> Any:
        with errors():
            return await method(*args, **kwargs)

    return operation
