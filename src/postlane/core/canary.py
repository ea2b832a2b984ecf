"""Import canaries: send the first few, hold the rest until they are sent. Pure; no I/O.

``postlane import --canary N`` writes the first ``N`` valid rows as usual and the rest with
their ``run_at`` pushed ``HOLD`` into the future, so no worker claims them (no claim query
changes, no column: a held delivery is a pending one that is not due). The worker's
housekeeping reads the canary's deliveries and settles it (``verdict``):

- every canary delivery finished, at least one sent, none dead or expired: *passed*; the
  held deliveries are made due at once, in the same transaction;
- a canary delivery dead or expired: *failed*; the import is paused with the reason (the
  first dead delivery, its reason and the provider's words) and the rest stays held;
- otherwise (still pending, sending or ambiguous): wait.

``postlane imports resume`` lets the rest go after a failed canary (the operator fixed the
cause): the hold is released and the canary recorded as ``released``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

HOLD = timedelta(days=3650)
"""How far a held delivery's ``run_at`` is pushed: far beyond any backoff or Retry-After,
so "due later than ``HELD_BEYOND`` from now" tells a held delivery from a waiting retry."""
HELD_BEYOND = timedelta(days=365)
assert HOLD > 2 * HELD_BEYOND  # a held delivery stays "held" for years after it was written

_FINISHED = ("sent", "dead", "expired", "cancelled", "suppressed")
_FAILED = ("dead", "expired")


def verdict(states: Mapping[str, int], first_failure: str | None) -> tuple[bool, str] | None:
    """``(passed, reason)`` once the canary deliveries (counted by state) settle it, None
    while it must wait."""
    failed = sum(states.get(s, 0) for s in _FAILED)
    if failed:
        return False, f"canary failed: {first_failure or f'{failed} delivery(ies) dead'}"
    total = sum(states.values())
    finished = sum(states.get(s, 0) for s in _FINISHED)
    if total == 0 or finished < total:
        return None
    if not states.get("sent", 0):
        return False, ("canary failed: no canary delivery was sent "
                       f"({', '.join(f'{n} {s}' for s, n in sorted(states.items()) if n)})")
    return True, f"canary passed: {states['sent']} of {total} sent"
