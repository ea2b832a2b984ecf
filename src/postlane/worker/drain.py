"""A drain with a bound: ``postlane worker --drain`` must not run forever when the provider
stays down (its breaker open, its account refusing), since a drain is what a deploy script or
a batch job waits on.

``drain_within`` runs a worker in drain mode for at most a given time. Past it the worker is
stopped gracefully (in-flight sends finish or are released; nothing stays leased) and the
answer says why the queue did not empty: what is still waiting, the open breakers with their
causes, the paused lanes. The deliveries themselves are untouched and wait for the next run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from postlane.status import breaker_reason, fleet_status
from postlane.worker.runner import Worker

DEFAULT_DRAIN_TIMEOUT_S = 1800.0
"""30 minutes: far longer than any healthy backlog a drain is used for, short enough that a
deploy or a cron job stuck behind a dead provider fails the same hour."""


@dataclass(frozen=True, slots=True)
class DrainResult:
    drained: bool
    reason: str = ""
    """Why the drain gave up (empty when it drained)."""


async def drain_within(worker: Worker, timeout_s: float) -> DrainResult:
    """Run ``worker`` (``config.drain`` set) until the queue is empty or ``timeout_s`` has
    passed; an error of the worker's own is raised as from ``Worker.run``."""
    if not worker.config.drain:
        raise ValueError("drain_within needs a worker in drain mode (WorkerConfig.drain)")
    task = asyncio.ensure_future(worker.run())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        worker.stop()
        await task
        raise
    if task in done:
        task.result()
        return DrainResult(True)
    worker.stop()
    await task
    return DrainResult(False, await _why_not_drained(worker, timeout_s))


async def _why_not_drained(worker: Worker, timeout_s: float) -> str:
    status = await fleet_status(worker.store)
    states = status.stats.states
    waiting = states.get("pending", 0) + states.get("sending", 0)
    parts = [f"gave up draining after {_span(timeout_s)}: {waiting} "
             f"deliver{'y' if waiting == 1 else 'ies'} still waiting"]
    others = {k: v for k, v in status.channels.pending.items()
              if v and k != worker.provider.channel}
    if others:
        parts.append("waiting for a worker of another channel: "
                     + ", ".join(f"{v} {k}" for k, v in sorted(others.items())))
    for account, record in sorted(status.breakers.items()):
        parts.append(f"breaker {account} {record.get('state', 'open')} "
                     f"({breaker_reason(record)})")
    if status.paused_lanes:
        parts.append(f"lanes paused: {', '.join(status.paused_lanes)}")
    quota = worker.limiter.quota if worker.limiter is not None else None
    if quota is not None:
        parts.append(f"a daily quota of {quota.quota} may hold the rest until it refills "
                     f"(bulk keeps {quota.reserve:.0%} of its burst for interactive mail)")
    if len(parts) == 1:
        parts.append("the provider keeps refusing or timing out (see the worker log)")
    return "; ".join(parts)


def _span(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
