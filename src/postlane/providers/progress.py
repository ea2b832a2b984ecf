"""How far one send attempt got, shared by the adapter that moves it and the worker that
reads it when the attempt's deadline passes.

The worker runs ``Provider.send`` as a task with an ``AttemptProgress`` bound to it (a
context variable, so the ``send`` signature stays one argument). The adapter calls
``reach(phase)`` as the attempt goes on. At the deadline the worker calls ``abandon()``,
which returns the phase reached and closes the gate: from then on ``reach`` raises
``AttemptAbandoned`` instead of recording, so a task that ignores its cancellation (some
libraries' internal ``wait_for`` swallows one on Python 3.11) can never pass the point of
no return *after* the worker has called the attempt transient. Adapters pass it by calling
``reach(Phase.RESPONSE)`` immediately before the write that hands the message over.

A lock makes ``reach`` and ``abandon`` atomic against each other, because an adapter may
move the attempt from a thread (SES runs boto3 in a thread pool).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from postlane.core.outcomes import Phase

P = ParamSpec("P")
R = TypeVar("R")


class AttemptAbandoned(Exception):
    """The worker gave up on this attempt at its deadline; the adapter must stop here.

    Raised inside an abandoned send task only; nobody awaits that task's result.
    """


class AttemptProgress:
    """The phase one attempt reached, and whether the worker still waits for it."""

    __slots__ = ("_abandoned", "_lock", "_phase")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase: Phase | None = None
        self._abandoned = False

    @property
    def phase(self) -> Phase | None:
        """The last phase reported; None if the adapter reported none."""
        return self._phase

    def reach(self, phase: Phase) -> None:
        """Record ``phase``; raise ``AttemptAbandoned`` if the worker has given up."""
        with self._lock:
            if self._abandoned:
                raise AttemptAbandoned(f"attempt abandoned before {phase}")
            self._phase = phase

    def abandon(self) -> Phase | None:
        """Stop the attempt where it is and say where that is."""
        with self._lock:
            self._abandoned = True
            return self._phase


_current: contextvars.ContextVar[AttemptProgress] = contextvars.ContextVar(
    "postlane_attempt_progress")


def current_progress() -> AttemptProgress:
    """The progress the worker bound to this attempt, or a private one when ``send`` was
    called directly (a test, ``postlane check``): adapters always have one to move."""
    try:
        return _current.get()
    except LookupError:
        return AttemptProgress()


def tracked_context(progress: AttemptProgress) -> contextvars.Context:
    """A copy of the current context in which ``progress`` is the attempt's progress: run
    the send task (or a thread's call) in it."""
    context = contextvars.copy_context()
    context.run(_current.set, progress)
    return context


def in_context(progress: AttemptProgress, call: Callable[P, R]) -> Callable[P, R]:
    """``call`` bound to run with ``progress`` current, for a thread pool (``run_in_executor``
    does not carry the caller's context the way ``asyncio.to_thread`` does)."""
    context = tracked_context(progress)

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.run(call, *args, **kwargs)
    return run
