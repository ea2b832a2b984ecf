"""Counts the no-op jobs a peer's handler ran, per process, into ``$BENCH_PEER_STATS/<pid>.json``.

The handler calls ``tick()``; a daemon thread (started lazily, so it also runs in processes
forked after import) rewrites the file every 20 ms with ``{"count", "first", "last"}``
(``time.time()`` of the first and the last job). The bench sums the files to know when a
queue is drained, and takes min(first) .. max(last) as the processing time.
"""

from __future__ import annotations

import json
import os
import threading
import time

_state = {"count": 0, "first": None, "last": None}
_lock = threading.Lock()
_writer_pid: int | None = None


def _path() -> str:
    return os.path.join(os.environ["BENCH_PEER_STATS"], f"{os.getpid()}.json")


def flush() -> None:
    # The whole write under the lock: the writer thread and a final flush() from the main
    # thread share the temporary file's name, and the second replace found it gone.
    with _lock:
        tmp = _path() + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(_state))
        os.replace(tmp, _path())


def _writer() -> None:
    while True:
        time.sleep(0.02)
        flush()


def tick() -> None:
    global _writer_pid
    now = time.time()
    with _lock:
        if _state["first"] is None:
            _state["first"] = now
        _state["count"] += 1
        _state["last"] = now
    if _writer_pid != os.getpid():
        _writer_pid = os.getpid()
        threading.Thread(target=_writer, daemon=True).start()
