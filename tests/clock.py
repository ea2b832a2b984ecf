"""A worker ``Clock`` for tests: time passes only when the code under test waits.

Each ``sleep`` moves time forward by exactly what was asked (plus a stall, when a test
injects one to stand for a blocked event loop) and records it, so a test reads the waits a
loop made instead of measuring them. Meant for one waiting task at a time: two concurrent
sleepers would each move time by their own amount.
"""

from __future__ import annotations

import asyncio


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        """Every wait, in seconds, in order (event waits that timed out included)."""
        self._stalls: list[float] = []

    def stall_next_sleep(self, seconds: float) -> None:
        """The next sleep returns ``seconds`` late, as after an event-loop stall."""
        self._stalls.append(seconds)

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.sleeps.append(seconds)
        self.now += seconds + (self._stalls.pop(0) if self._stalls else 0.0)
        await asyncio.sleep(0)  # still a suspension point, like a real sleep

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        await asyncio.sleep(0)
        if not event.is_set():
            await self.sleep(timeout)
        return event.is_set()
