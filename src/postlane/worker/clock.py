"""The worker's time source: every timing rule (pacing, backoff, rescue interval) reads and
waits through one ``Clock``, so tests can hold time still and move it by hand.

The real clock is the event loop's: ``time.monotonic`` for reading, ``asyncio.sleep`` and
``asyncio.timeout`` for waiting. A test clock only has to keep these three consistent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait for ``event`` at most ``timeout`` seconds on this clock; True if it was set."""


class SystemClock:
    """Real time, the default."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        return event.is_set()


SYSTEM_CLOCK = SystemClock()
