"""celery peer on Redis: ``python celery_peer.py enqueue N`` publishes N no-op tasks over
one producer connection (``apply_async``: celery has no bulk publish), and ``celery -A
celery_peer worker -c 2 -P prefork`` consumes them; results are ignored. Redis URL and queue
name come from ``BENCH_REDIS_URL`` and ``BENCH_QUEUE``."""

from __future__ import annotations

import json
import os
import sys
import time

import _peerstats
from celery import Celery

QUEUE = os.environ.get("BENCH_QUEUE", "postlane-bench")
app = Celery("celery_peer", broker=os.environ["BENCH_REDIS_URL"])
app.conf.update(task_ignore_result=True, task_default_queue=QUEUE,
                broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)


@app.task(name="noop")
def noop(i: int) -> None:
    _peerstats.tick()


if __name__ == "__main__":
    jobs = int(sys.argv[2])
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(jobs):
            noop.apply_async((i,), producer=producer)
    print(json.dumps({"seconds": time.perf_counter() - started}))
