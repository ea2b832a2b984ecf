"""dramatiq peer on Redis: ``python dramatiq_peer.py enqueue N`` sends N no-op messages
(``actor.send``: dramatiq has no bulk enqueue), and ``dramatiq dramatiq_peer --processes 2
--threads 8`` consumes them with the default middleware. Redis URL and queue name come from
``BENCH_REDIS_URL`` and ``BENCH_QUEUE``."""

from __future__ import annotations

import json
import os
import sys
import time

import _peerstats
import dramatiq
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"],
                     namespace=os.environ.get("BENCH_QUEUE", "postlane-bench"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=0)
def noop(i: int) -> None:
    _peerstats.tick()


if __name__ == "__main__":
    jobs = int(sys.argv[2])
    started = time.perf_counter()
    for i in range(jobs):
        noop.send(i)
    print(json.dumps({"seconds": time.perf_counter() - started}))
