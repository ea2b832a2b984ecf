"""The one loop every long-running worker task runs in: repeat a step, and when the step
fails with an error the worker cannot handle (database down, Redis down), log it, count it,
wait a little longer each time, and carry on. A background task that died on the first
outage would leave the worker claiming without acking, or sending without pacing.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from postlane.worker.clock import Clock

log = logging.getLogger("postlane.worker")

BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 5.0


def loop_backoff_s(failures: int) -> float:
    """The wait after ``failures`` failures in a row: doubling from 0.2 s, at most 5 s, so an
    outage is retried quickly at first and then without flooding the log."""
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * float(2 ** min(failures, 6)))


async def supervise(
    where: str,
    step: Callable[[], Awaitable[bool]],
    *,
    clock: Clock,
    counters: Counter[str],
) -> None:
    """Run ``step`` until it returns True (its job is done), backing off while it fails.

    Only ``Exception`` is caught: cancellation (a stop) ends the loop at once.
    """
    failures = 0
    while True:
        try:
            if await step():
                return
            failures = 0
        except Exception as exc:
            failures += 1
            counters["errors"] += 1
            delay = loop_backoff_s(failures)
            log.error("%s: %s: %s; retrying in %.1fs", where, type(exc).__name__, exc, delay)
            await clock.sleep(delay)
