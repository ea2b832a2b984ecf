"""The delivery state machine, drawn once.

::

                enqueue (in caller's txn)
                        |
                        v
       +-----------> pending ------------------------------+
       | retry / throttled   | claim (lease)               | cancel / expire
       |                     v                             v
       +--------------- sending --------------------> dead | expired | cancelled
                       |      \\
                accepted       lease lost after the attempt started / timeout
                       v        v
                     sent     ambiguous --> reconcile: sent | pending | (held for an operator)

Each member's docstring says who moves a delivery *out* of that state.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "pending"
    """Waiting for ``run_at``. Left by a worker's claim, by expiry, or by an operator's cancel."""

    SENDING = "sending"
    """Leased by one worker. Left by that worker's outcome (guarded by its lease) or,
    once the lease has expired, by the rescuer: back to ``pending`` when the attempt never
    started, to ``ambiguous`` when it had."""

    SENT = "sent"
    """Terminal: the provider accepted it. Only provider events (delivered, bounced) follow."""

    AMBIGUOUS = "ambiguous"
    """The provider may have accepted it. Left by reconciliation (``sent`` or ``pending``)
    or by an operator; never re-sent blindly."""

    DEAD = "dead"
    """Terminal: dead-lettered with a reason. Left only by an operator's replay."""

    EXPIRED = "expired"
    """Terminal: past its validity window before it could be sent. Nothing to fix."""

    CANCELLED = "cancelled"
    """Terminal: withdrawn by the application or an operator before it was sent."""

    SUPPRESSED = "suppressed"
    """Terminal: the address is on the suppression list (a hard bounce or a complaint), so it
    was not sent. Not a dead letter. Left only by an operator who lifts the suppression and
    replays it."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[State] = frozenset(
    {State.SENT, State.DEAD, State.EXPIRED, State.CANCELLED, State.SUPPRESSED}
)
"""States nothing automatic leaves; retention prunes deliveries in these states."""


class DeadReason(StrEnum):
    """Why a delivery was dead-lettered; alerts route on this."""

    PERMANENT = "permanent"
    BUDGET_EXHAUSTED = "budget_exhausted"
    HANDLER_ERROR = "handler_error"
    EXPIRED = "expired"
    """Not a failure to fix: the message outlived its usefulness (alerts route it apart)."""
    AMBIGUOUS_UNRESOLVED = "ambiguous_unresolved"
