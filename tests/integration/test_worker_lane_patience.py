"""Each lane's own patience, through the real Worker on both engines: the attempt timeout and
the retry backoff a lane sets win over the worker-wide ones; a lane that sets none uses those.
"""

from __future__ import annotations

from dataclasses import replace

from conftest import msg
from worker_helpers import LANES, Provider, delivery_when, fast_config, in_state, running

from postlane import State
from postlane.core.outcomes import Outcome
from postlane.core.policy import RetryPolicy
from postlane.store import Store
from postlane.worker import Worker


async def test_each_lane_waits_its_own_attempt_timeout(store: Store) -> None:
    provider = Provider(deduplicate=False, lookup=False)
    provider.hang("reset:1", 5.0)  # accepted; the answer would come after 5 s
    provider.hang("digest:1", 0.5)  # a slow answer, within the worker-wide timeout
    impatient = (replace(LANES[0], attempt_timeout_s=0.2), LANES[1])
    reset = await store.enqueue(msg("reset:1", lane="interactive"))
    digest = await store.enqueue(msg("digest:1", lane="bulk"))
    config = fast_config(attempt_timeout_s=5.0, lanes=impatient)
    async with running(Worker(store, provider, config=config)):
        held = await in_state(store, reset.id, State.AMBIGUOUS)
        sent = await in_state(store, digest.id, State.SENT)
    assert held.last_error == "no answer within 0.2s after the request left"
    assert sent.attempts == 1 and len(provider.requests_of(digest.id)) == 1


async def test_each_lane_backs_off_with_its_own_base(store: Store) -> None:
    provider = Provider()
    for key in ("reset:2", "digest:2"):
        provider.script_key(key, Outcome.transient("503 service unavailable"))
    quick = (replace(LANES[0], retry_base_s=0.01, retry_cap_s=0.02), LANES[1])
    reset = await store.enqueue(msg("reset:2", lane="interactive"))
    digest = await store.enqueue(msg("digest:2", lane="bulk"))
    # The worker-wide backoff is an hour: only a lane's own base can retry in time.
    config = fast_config(lanes=quick, retry=RetryPolicy(base_s=3600.0, cap_s=7200.0))
    async with running(Worker(store, provider, config=config, rand=lambda: 0.5)):
        await in_state(store, reset.id, State.SENT)
        waiting = await delivery_when(store, digest.id,
                                      lambda d: d.state is State.PENDING and d.attempts == 1)
    retry = [e.data for e in await store.timeline(reset.id) if e.kind == "retry_scheduled"]
    assert retry[0]["delay_s"] == 0.01  # 0.5 * min(0.02, 0.01 * 2)
    later = [e.data for e in await store.timeline(digest.id) if e.kind == "retry_scheduled"]
    assert later[0]["delay_s"] == 3600.0  # 0.5 * min(7200, 3600 * 2)
    assert waiting.run_at > waiting.updated_at
