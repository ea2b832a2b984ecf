"""``postlane sandbox`` with a memory that survives its own death: the fault harness's provider.

    python -m bench.chaos.sandbox --port 8125 --journal /tmp/accepted.tsv --timeout-rate 0.05 \
        --timeout-delay 4 --reject '^reject-'

It serves the very app ``postlane sandbox`` serves (``postlane.providers.sandbox_server
.create_app`` over ``SandboxEngine``, uvicorn, the same options), and adds one thing the CLI
has no option for: every acceptance is appended to ``--journal`` (``key<TAB>id<TAB>unix
time<TAB>pid``, one ``write(2)`` per line on an ``O_APPEND`` descriptor, so a line written is
kept even if the process is SIGKILLed the next instant). On start it reloads the journal into
the engine's idempotency memory, as a real provider's would survive a restart: a key accepted
before a crash is still a suppressed duplicate after it, and is still found by lookup.

The journal is also the harness's provider-side truth: a key on two lines was accepted twice
(a duplicate that reached the recipient).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import uvicorn

from postlane.providers.sandbox import SandboxConfig, SandboxEngine
from postlane.providers.sandbox_server import bind, create_app


def read_journal(path: str) -> list[tuple[str, str, float, int]]:
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4:  # a torn last line (killed mid-write) is not an acceptance
                    rows.append((parts[0], parts[1], float(parts[2]), int(parts[3])))
    except FileNotFoundError:
        pass
    return rows


def journaled_engine(config: SandboxConfig, journal: str) -> SandboxEngine:
    engine = SandboxEngine(config)
    rows = read_journal(journal)
    for key, message_id, at, _pid in rows:
        engine._keys[key] = (at, message_id)  # the engine's idempotency memory
    engine._ids = len(rows)  # keep message ids unique across lives
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def on_accept(key: str, message_id: str, to: str) -> None:
        os.write(fd, f"{key}\t{message_id}\t{time.time():.6f}\t{pid}\n".encode())

    engine.on_accept = on_accept
    return engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--journal", required=True)
    p.add_argument("--rate", type=float, default=None)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--timeout-rate", type=float, default=0.0)
    p.add_argument("--timeout-delay", type=float, default=5.0)
    p.add_argument("--reject", default=None)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args()
    config = SandboxConfig(rate=a.rate, error_rate=a.error_rate, timeout_rate=a.timeout_rate,
                           timeout_delay_s=a.timeout_delay, reject=a.reject, seed=a.seed)
    engine = journaled_engine(config, a.journal)
    sock = bind(a.host, a.port)
    server = uvicorn.Server(uvicorn.Config(
        create_app(engine), log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=1, timeout_keep_alive=30,
    ))
    print(f"sandbox listening on http://{a.host}:{a.port} (pid {os.getpid()}, "
          f"{len(engine._keys)} keys remembered)", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
