"""The fault harness: deliveries through the HTTP sandbox while a driver breaks everything
around them, then a queue checker's audit. Exits non-zero on any violation.

    python -m bench.chaos                    # 20,000 deliveries, >= 10 kills, ~6 min
    python -m bench.chaos --short            # the CI form: 2,000 deliveries, 3 kills, ~1 min
    python -m bench.chaos --no-pg-restart    # leave the shared PostgreSQL server alone
    python -m bench.chaos --failover         # a fallback provider takes over the outage

What runs:

- the provider: ``python -m bench.chaos.sandbox`` -- the app ``postlane sandbox`` serves, with
  ``--timeout-rate`` accept-then-timeout (the answer held ``--timeout-delay`` s, longer than
  the workers' ``--attempt-timeout``), ``--reject '^reject-'`` (400, permanent) for a known
  set of recipients, and its accepted keys journaled so they survive its own death;
- ``--workers`` ``postlane worker --provider sandbox+http://127.0.0.1:PORT`` processes sharing
  ``--rate`` through Redis, each restarted by the driver whenever it exits;
- deliveries: three quarters enqueued before the workers start (``Store.enqueue_many``), the
  rest trickled in small committed batches (``postlane.enqueue_many``) while the faults
  happen, each batch retried with the same keys until its commit is confirmed.

The faults, at random moments (seeded): ``--kills`` SIGKILLs of a random worker (restarted
0.2-2 s later); one worker SIGSTOPped for its lease plus 3 s, then SIGCONTed; one PostgreSQL
restart (``pg_ctlcluster --skip-systemctl-redirect <version> main restart``; the server is
started again at the end whatever happens); the provider down for ``--outage`` seconds
(SIGKILL, then a new process on the same port; ``--outage-mode stop`` SIGSTOPs it instead).

With ``--failover`` (issue 16) a second sandbox with its own journal runs as every worker's
``--fallback`` (``--fallback-rate`` the same ceiling), and the outage is the primary's: the
workers fail over while it is down and come back when its breaker's probe succeeds. The audit
reads both journals as one provider-side truth: a key accepted by both providers is a
duplicate like any other (an ambiguous attempt must never fail over before it is reconciled).

The audit, as a queue checker would do it, from the database and the provider's journal:
lost (enqueued, never terminal) = 0; duplicates (a key the provider accepted more than once)
= 0; unexpected (accepted by the provider, never enqueued) = 0; every enqueued delivery
exactly once in the database, in a terminal state; sent <=> accepted by the provider; the
dead-letter store holds exactly the injected permanent failures (reason ``permanent``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import _harness as h
from bench.chaos.sandbox import read_journal
from postlane import Message, enqueue_many

TERMINAL = {"sent", "dead", "expired", "cancelled", "suppressed"}
REJECT_PATTERN = "^reject-"


@dataclass
class ChaosConfig:
    deliveries: int = 20_000
    upfront: float = 0.75
    workers: int = 3
    kills: int = 12
    rate: float = 100.0
    lease_s: float = 5.0
    attempt_timeout_s: float = 2.0
    timeout_rate: float = 0.05
    timeout_delay_s: float = 4.0
    error_rate: float = 0.01
    rejects: int = 200
    outage_s: float = 60.0
    outage_mode: str = "kill"
    pg_restart: bool = True
    sigstop: bool = True
    settle_timeout_s: float = 600.0
    seed: int = 20240601
    concurrency: int = 50
    failover: bool = False
    """A second sandbox as every worker's ``--fallback``; the outage is the primary's."""

    @classmethod
    def short(cls) -> ChaosConfig:
        return cls(deliveries=2_000, workers=2, kills=3, rate=200.0, lease_s=3.0,
                   attempt_timeout_s=1.0, timeout_delay_s=2.0, rejects=40, outage_s=5.0,
                   pg_restart=False, settle_timeout_s=60.0, concurrency=40)

    @property
    def expected_s(self) -> float:
        return self.deliveries / self.rate


@dataclass
class Audit:
    enqueued: int = 0
    in_database: int = 0
    states: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicates: int = 0
    unexpected: int = 0
    not_exactly_once_in_db: int = 0
    sent_not_accepted: int = 0
    accepted_not_sent: int = 0
    dead_letters: int = 0
    dead_reasons: dict[str, int] = field(default_factory=dict)
    dead_unexplained: int = 0
    rejects_not_dead: int = 0
    dead_letter_rows_missing: int = 0
    provider_accepted: int = 0
    provider_accepts_by_life: dict[str, int] = field(default_factory=dict)
    accepted_by_provider: dict[str, int] = field(default_factory=dict)
    """Failover: keys accepted by the primary and by the fallback."""
    on_both_providers: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def violations(self) -> dict[str, int]:
        checks = {
            "lost": self.lost, "duplicates": self.duplicates, "unexpected": self.unexpected,
            "not_exactly_once_in_db": self.not_exactly_once_in_db,
            "sent_not_accepted": self.sent_not_accepted,
            "accepted_not_sent": self.accepted_not_sent,
            "dead_unexplained": self.dead_unexplained, "rejects_not_dead": self.rejects_not_dead,
            "dead_letter_rows_missing": self.dead_letter_rows_missing,
        }
        return {k: v for k, v in checks.items() if v}


@dataclass
class ChaosReport:
    config: dict[str, Any]
    audit: Audit
    events: list[str]
    kills: int = 0
    restarts: int = 0
    unexpected_exits: int = 0
    stopped_for_s: float = 0.0
    pg_restarted: bool = False
    outage_s: float = 0.0
    sandbox_lives: int = 0
    duration_s: float = 0.0
    settled: bool = False
    sandbox_stats: list[dict[str, Any]] = field(default_factory=list)
    worker_counters: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.settled and not self.audit.violations


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_version() -> str:
    versions = sorted((p.name for p in Path("/etc/postgresql").iterdir() if p.name.isdigit()),
                      key=int) if Path("/etc/postgresql").exists() else []
    return versions[-1] if versions else "15"


def pg_ready(timeout: float = 2.0) -> bool:
    try:
        with psycopg.connect(h.with_admin_db(), connect_timeout=int(max(1, timeout))) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def ensure_pg_running() -> None:
    """Whatever happened, leave the shared PostgreSQL server running."""
    if pg_ready():
        return
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", pg_version(), "main", "start"],
                   capture_output=True, timeout=120, check=False)
    h.wait_for(pg_ready, 60, "PostgreSQL to accept connections again", interval=0.5)


def messages_for(config: ChaosConfig) -> list[Message]:
    rng = random.Random(config.seed)
    reject_at = set(rng.sample(range(config.deliveries), config.rejects))
    out = []
    for i in range(config.deliveries):
        to = f"reject-{i}@example.com" if i in reject_at else f"user{i}@example.com"
        lane = "interactive" if i % 10 == 0 else "bulk"
        out.append(Message(key=f"chaos:{i}", to=to, subject="Chaos", text=h.TEXT, lane=lane,
                           metadata={"i": i}))
    rng.shuffle(out)
    return out


class Harness:
    def __init__(self, config: ChaosConfig, db: str, redis_url: str, work: Path,
                 log: Any = print) -> None:
        self.config = config
        self.db = db
        self.redis_url = redis_url
        self.work = work
        self.say = log
        self.rng = random.Random(config.seed + 1)
        self.port = free_port()
        self.journal = work / "accepted.tsv"
        self.fallback_port = free_port()
        self.fallback_journal = work / "accepted-fallback.tsv"
        self.fallback: h.Proc | None = None
        self.workers: dict[int, h.Proc | None] = {}
        self.restart_at: dict[int, float] = {}
        self.expected_exit: set[int] = set()
        self.stopped: int | None = None
        self.sandbox: h.Proc | None = None
        self.sandbox_lives = 0
        self.report = ChaosReport(asdict(config), Audit(), [])
        self.t0 = time.monotonic()
        self.enqueued: set[str] = set()
        self._enqueued_lock = threading.Lock()
        self._producer_error: BaseException | None = None
        self.sandbox_stats: list[dict[str, Any]] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def event(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.2f}s] {text}"
        self.report.events.append(line)
        self.say(line)

    # -- the provider ------------------------------------------------------------------------
    def start_sandbox(self) -> None:
        c = self.config
        self.sandbox_lives += 1
        self.sandbox = h.Proc(
            [sys.executable, "-m", "bench.chaos.sandbox", "--port", str(self.port), "--journal",
             str(self.journal), "--timeout-rate", str(c.timeout_rate), "--timeout-delay",
             str(c.timeout_delay_s), "--error-rate", str(c.error_rate), "--reject",
             REJECT_PATTERN, "--seed", str(c.seed + self.sandbox_lives)],
            self.work / f"sandbox-{self.sandbox_lives}.log", name=f"sandbox #{self.sandbox_lives}",
            cwd=Path(__file__).resolve().parents[2],
            env=h.clean_env(PYTHONPATH=str(Path(__file__).resolve().parents[2])))
        h.wait_for(self._sandbox_up, 30, "the sandbox to listen")

    def _sandbox_up(self, port: int | None = None) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port or self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def start_fallback(self) -> None:
        """The fallback provider (``--failover``): a sandbox like the primary, its own
        journal and port; it stays up through the run."""
        c = self.config
        self.fallback = h.Proc(
            [sys.executable, "-m", "bench.chaos.sandbox", "--port", str(self.fallback_port),
             "--journal", str(self.fallback_journal), "--timeout-rate", str(c.timeout_rate),
             "--timeout-delay", str(c.timeout_delay_s), "--error-rate", str(c.error_rate),
             "--reject", REJECT_PATTERN, "--seed", str(c.seed + 1000)],
            self.work / "sandbox-fallback.log", name="fallback sandbox",
            cwd=Path(__file__).resolve().parents[2],
            env=h.clean_env(PYTHONPATH=str(Path(__file__).resolve().parents[2])))
        h.wait_for(lambda: self._sandbox_up(self.fallback_port), 30,
                   "the fallback sandbox to listen")

    def sandbox_stats_now(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/sandbox/stats",
                                        timeout=5) as answer:
                data = json.loads(answer.read())
        except (OSError, ValueError):
            return None
        data.pop("accepted_keys", None)
        data.pop("by_second", None)
        data["life"] = self.sandbox_lives
        return data

    # -- workers -----------------------------------------------------------------------------
    @property
    def provider_url(self) -> str:
        return f"sandbox+http://127.0.0.1:{self.port}"

    def start_worker(self, slot: int) -> None:
        c = self.config
        fallback = (["--fallback", f"sandbox+http://127.0.0.1:{self.fallback_port}",
                     "--fallback-rate", f"{c.rate:g}/s"] if c.failover else [])
        self.workers[slot] = h.postlane(
            self.db, "worker", "--provider", self.provider_url, *fallback,
            "--rate", f"{c.rate:g}/s",
            "--limiter", self.redis_url, "--lease", f"{c.lease_s:g}s", "--attempt-timeout",
            f"{c.attempt_timeout_s:g}s", "--concurrency", str(c.concurrency), "--grace", "2s",
            "--log-level", "WARNING", log_path=self.work / f"worker-{slot}.log",
            name=f"worker {slot}")

    def supervise(self) -> None:
        now = time.monotonic()
        for slot, proc in list(self.workers.items()):
            if proc is None:
                if now >= self.restart_at.get(slot, 0):
                    self.start_worker(slot)
                    self.report.restarts += 1
                    self.event(f"worker {slot} restarted (pid {self.workers[slot].pid})")  # type: ignore[union-attr]
                continue
            if proc.alive():
                continue
            code = proc.popen.returncode
            if proc.pid in self.expected_exit:
                self.expected_exit.discard(proc.pid)
            else:
                self.report.unexpected_exits += 1
                self.event(f"worker {slot} (pid {proc.pid}) exited by itself with {code}: "
                           + proc.log_tail(3).replace("\n", " | ")[-400:])
            self.workers[slot] = None
            self.restart_at.setdefault(slot, now + 0.5)
            if self.restart_at[slot] < now:
                self.restart_at[slot] = now + 0.5

    def kill_random_worker(self) -> bool:
        """SIGKILL a running worker (not the stopped one); False when none runs right now."""
        alive = [(s, p) for s, p in self.workers.items()
                 if p is not None and p.alive() and s != self.stopped]
        if not alive:
            return False
        slot, proc = self.rng.choice(alive)
        self.expected_exit.add(proc.pid)
        proc.signal(9)
        proc.wait(10)
        self.report.kills += 1
        self.restart_at[slot] = time.monotonic() + self.rng.uniform(0.2, 2.0)
        self.workers[slot] = None
        self.event(f"SIGKILL worker {slot} (pid {proc.pid}) [{self.report.kills}]")
        return True

    # -- the producer ------------------------------------------------------------------------
    def produce(self, messages: list[Message], until_s: float) -> None:
        """Trickle ``messages`` in batches of 20 over ``until_s`` seconds; every batch is
        retried with the same keys until its commit is confirmed."""
        try:
            batches = [messages[i:i + 20] for i in range(0, len(messages), 20)]
            pause = until_s / max(1, len(batches))
            conn: psycopg.Connection[Any] | None = None
            for batch in batches:
                while True:
                    try:
                        if conn is None or conn.closed:
                            conn = psycopg.connect(self.db, connect_timeout=3)
                        with conn.transaction():
                            enqueue_many(conn, batch)
                        break
                    except psycopg.Error:
                        with contextlib.suppress(Exception):
                            if conn is not None:
                                conn.close()
                        conn = None
                        time.sleep(0.5)
                with self._enqueued_lock:
                    self.enqueued.update(m.key for m in batch)
                time.sleep(pause)
            if conn is not None:
                conn.close()
        except BaseException as exc:  # pragma: no cover - surfaced by the audit
            self._producer_error = exc

    # -- the run -----------------------------------------------------------------------------
    def schedule(self) -> list[tuple[float, str]]:
        c = self.config
        span = c.expected_s
        events: list[tuple[float, str]] = []
        kill_span = max(5.0, span * 0.85 + (c.outage_s if c.outage_mode == "kill" else 0))
        for _ in range(c.kills):
            events.append((self.rng.uniform(1.5, kill_span), "kill"))
        if c.sigstop:
            events.append((max(2.0, span * 0.2), "sigstop"))
        if c.pg_restart:
            events.append((span * 0.4, "pg_restart"))
        if c.outage_s > 0:
            events.append((span * 0.55, "outage"))
        return sorted(events)

    def run(self) -> ChaosReport:
        c = self.config
        messages = messages_for(c)
        upfront = int(len(messages) * c.upfront)
        self.start_sandbox()
        if c.failover:
            self.start_fallback()
        h.migrate(self.db, self.work)
        asyncio.run(_load(self.db, messages[:upfront]))
        self.enqueued.update(m.key for m in messages[:upfront])
        self.event(f"{upfront:,} deliveries enqueued; starting {c.workers} workers against "
                   f"{self.provider_url} at {c.rate:g}/s")
        for slot in range(c.workers):
            self.start_worker(slot)
        self.t0 = time.monotonic()
        producer = threading.Thread(target=self.produce, args=(messages[upfront:],
                                                               c.expected_s * 0.6), daemon=True)
        producer.start()
        pending = self.schedule()
        stop_until = outage_until = 0.0
        restart_thread: threading.Thread | None = None
        while pending or stop_until or outage_until or producer.is_alive() or (
                restart_thread and restart_thread.is_alive()):
            now = time.monotonic() - self.t0
            while pending and pending[0][0] <= now:
                _, what = pending.pop(0)
                if what == "kill":
                    if not self.kill_random_worker():  # none running: a little later
                        pending.append((now + 1.0, "kill"))
                        pending.sort()
                elif what == "sigstop":
                    stop_until = self.sigstop()
                elif what == "pg_restart":
                    restart_thread = threading.Thread(target=self.restart_pg, daemon=True)
                    restart_thread.start()
                elif what == "outage":
                    outage_until = self.provider_down()
            if stop_until and now >= stop_until:
                self.sigcont()
                stop_until = 0.0
            if outage_until and now >= outage_until:
                self.provider_up()
                outage_until = 0.0
            self.supervise()
            time.sleep(0.05)
        self.event("all faults done; waiting for every delivery to be terminal")
        self.report.settled = self.settle()
        self.report.duration_s = time.monotonic() - self.t0
        stats = self.sandbox_stats_now()
        if stats:
            self.sandbox_stats.append(stats)
        for proc in self.workers.values():
            if proc is not None:
                proc.stop(10)
        if self._producer_error is not None:
            self.event(f"producer failed: {self._producer_error!r}")
        return self.report

    def sigstop(self) -> float:
        candidates = [s for s, p in self.workers.items() if p is not None and p.alive()]
        if not candidates:
            self.event("SIGSTOP skipped: no running worker")
            return 0.0
        slot = self.rng.choice(candidates)
        proc = self.workers[slot]
        assert proc is not None
        proc.signal(19)  # SIGSTOP
        self.stopped = slot
        hold = self.config.lease_s + 3.0
        self.report.stopped_for_s = hold
        self.event(f"SIGSTOP worker {slot} (pid {proc.pid}) for {hold:g}s "
                   f"(lease {self.config.lease_s:g}s)")
        return time.monotonic() - self.t0 + hold

    def sigcont(self) -> None:
        if self.stopped is None:
            return
        proc = self.workers.get(self.stopped)
        if proc is not None:
            proc.signal(18)  # SIGCONT
            self.event(f"SIGCONT worker {self.stopped} (pid {proc.pid})")
        self.stopped = None

    def restart_pg(self) -> None:
        version = pg_version()
        self.event(f"PostgreSQL {version} restart begins")
        started = time.monotonic()
        out = subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main",
                              "restart"], capture_output=True, text=True, timeout=180,
                             check=False)
        ensure_pg_running()
        self.report.pg_restarted = out.returncode == 0
        self.event(f"PostgreSQL restart done in {time.monotonic() - started:.1f}s "
                   f"(exit {out.returncode}"
                   f"{': ' + out.stderr.strip()[:200] if out.returncode else ''})")

    def provider_down(self) -> float:
        c = self.config
        assert self.sandbox is not None
        stats = self.sandbox_stats_now()
        if stats:
            self.sandbox_stats.append(stats)
        if c.outage_mode == "stop":
            self.sandbox.signal(19)
            self.event(f"provider SIGSTOPped for {c.outage_s:g}s")
        else:
            self.sandbox.kill()
            self.event(f"provider SIGKILLed (pid {self.sandbox.pid}); back in {c.outage_s:g}s")
        self.report.outage_s = c.outage_s
        return time.monotonic() - self.t0 + c.outage_s

    def provider_up(self) -> None:
        assert self.sandbox is not None
        if self.config.outage_mode == "stop":
            self.sandbox.signal(18)
            self.event("provider SIGCONTed")
        else:
            self.start_sandbox()
            self.event(f"provider restarted on port {self.port} (pid {self.sandbox.pid}, "
                       f"life {self.sandbox_lives}, journal reloaded)")

    def settle(self) -> bool:
        deadline = time.monotonic() + self.config.settle_timeout_s
        last_print = 0.0
        while time.monotonic() < deadline:
            self.supervise()
            try:
                rows = h.query(self.db, "SELECT state, count(*) FROM postlane_deliveries "
                                        "GROUP BY state")
            except psycopg.Error:
                time.sleep(1)
                continue
            states = dict(rows)
            open_ = sum(v for k, v in states.items() if k not in TERMINAL)
            if time.monotonic() - last_print > 10:
                self.event(f"states {states}")
                last_print = time.monotonic()
            if open_ == 0 and sum(states.values()) >= len(self.enqueued):
                self.event(f"settled: {states}")
                return True
            time.sleep(0.5)
        self.event("NOT settled before the deadline")
        return False

    # -- the audit ---------------------------------------------------------------------------
    def audit(self) -> Audit:
        a = self.report.audit
        rows = h.query(self.db, "SELECT idempotency_key, state, recipient, dead_reason "
                                "FROM postlane_delivery_rows")
        dl_ids = {r[0] for r in h.query(
            self.db, "SELECT d.idempotency_key FROM postlane_dead_letters l "
                     "JOIN postlane_delivery_rows d ON d.id = l.delivery_id")}
        journal = read_journal(str(self.journal))
        fallback = read_journal(str(self.fallback_journal)) if self.config.failover else []
        if self.config.failover:
            primary_keys = {key for key, *_ in journal}
            fallback_keys = {key for key, *_ in fallback}
            a.accepted_by_provider = {"primary": len(primary_keys),
                                      "fallback": len(fallback_keys)}
            both = primary_keys & fallback_keys
            a.on_both_providers = len(both)
            if both:
                a.examples["on_both_providers"] = sorted(both)[:5]
        journal = journal + fallback
        accepts = Counter(key for key, *_ in journal)
        by_life = Counter(str(pid) for *_, pid in journal)
        per_key = Counter(r[0] for r in rows)
        state = {r[0]: r[1] for r in rows}
        recipient = {r[0]: r[2] for r in rows}
        reject = re.compile(REJECT_PATTERN)
        enqueued = self.enqueued
        a.enqueued = len(enqueued)
        a.in_database = len(rows)
        a.states = dict(Counter(state.values()))
        a.provider_accepted = len(accepts)
        a.provider_accepts_by_life = dict(by_life)

        def note(name: str, keys: list[str]) -> int:
            if keys:
                a.examples[name] = sorted(keys)[:5]
            return len(keys)

        a.lost = note("lost", [k for k in enqueued if state.get(k) not in TERMINAL])
        a.duplicates = note("duplicates", [k for k, n in accepts.items() if n > 1])
        a.unexpected = note("unexpected", [k for k in accepts if k not in enqueued])
        a.not_exactly_once_in_db = note(
            "not_exactly_once_in_db",
            [k for k in enqueued if per_key.get(k, 0) != 1] + [k for k in per_key
                                                               if k not in enqueued])
        a.sent_not_accepted = note("sent_not_accepted",
                                   [k for k, s in state.items()
                                    if s == "sent" and k not in accepts])
        a.accepted_not_sent = note("accepted_not_sent",
                                   [k for k in accepts if k in state and state[k] != "sent"])
        dead = [r for r in rows if r[1] in ("dead", "expired")]
        a.dead_letters = len(dead)
        a.dead_reasons = dict(Counter(r[3] or r[1] for r in dead))
        a.dead_unexplained = note("dead_unexplained", [
            r[0] for r in dead if not (reject.search(r[2]) and r[3] == "permanent")])
        a.rejects_not_dead = note("rejects_not_dead", [
            k for k in enqueued if reject.search(recipient.get(k, "")) and state.get(k) != "dead"])
        a.dead_letter_rows_missing = note("dead_letter_rows_missing",
                                          [r[0] for r in dead if r[0] not in dl_ids])
        return a


async def _load(db: str, messages: list[Message]) -> None:
    from postlane.store import open_store

    async with open_store(db) as store:
        for i in range(0, len(messages), 5000):
            await store.enqueue_many(messages[i:i + 5000])


def run_chaos(config: ChaosConfig, *, keep: bool = False, log: Any = print) -> ChaosReport:
    from bench._common import fresh_pg_database

    work = Path(h.tempfile.mkdtemp(prefix="postlane-chaos-"))
    harness: Harness | None = None
    try:
        with h.claimed_redis_db() as redis_url, fresh_pg_database("postlane_chaos") as db:
            harness = Harness(config, db, redis_url, work, log)
            try:
                report = harness.run()
            finally:
                for proc in harness.workers.values():
                    if proc is not None:
                        proc.kill()
                ensure_pg_running()
            harness.audit()
            if harness.sandbox is not None:
                harness.sandbox.stop(10)
            if harness.fallback is not None:
                harness.fallback.stop(10)
            report.sandbox_lives = harness.sandbox_lives
            report.sandbox_stats = harness.sandbox_stats
            report.worker_counters = _worker_counters(work)
            h.redis_delete_matching(redis_url, "postlane:limiter:*", "postlane:breaker:*")
            return report
    finally:
        if harness is not None:
            for proc in harness.workers.values():
                if proc is not None:
                    proc.kill()
            if harness.sandbox is not None:
                harness.sandbox.kill()
            if harness.fallback is not None:
                harness.fallback.kill()
        ensure_pg_running()
        if keep or (harness is not None and not harness.report.ok):
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _worker_counters(work: Path) -> dict[str, int]:
    """Sums of the 'worker ... stopped: {counters}' lines of gracefully stopped workers."""
    total: Counter[str] = Counter()
    for path in work.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            match = re.search(r"stopped: (\{.*\})", line)
            if match:
                with contextlib.suppress(ValueError, SyntaxError):
                    import ast

                    total.update(ast.literal_eval(match.group(1)))
    return dict(total)


def summary(report: ChaosReport) -> str:
    a = report.audit
    c = report.config
    lines = [
        f"deliveries enqueued: {a.enqueued:,} (in the database: {a.in_database:,})",
        f"final states: {a.states}",
        f"faults: {report.kills} SIGKILLs of workers ({report.restarts} restarts, "
        f"{report.unexpected_exits} exits by themselves), SIGSTOP past the lease: "
        f"{report.stopped_for_s:g}s, PostgreSQL restarted: {report.pg_restarted}, provider "
        f"down {report.outage_s:g}s ({c['outage_mode']}; {report.sandbox_lives} sandbox lives), "
        f"{c['timeout_rate']:.0%} accept-then-timeout, {c['error_rate']:.0%} 503s, "
        f"{c['rejects']} rejected recipients",
        f"provider accepted {a.provider_accepted:,} keys (accept lines by sandbox pid: "
        f"{a.provider_accepts_by_life})",
        *([f"failover: keys accepted by the primary {a.accepted_by_provider.get('primary', 0):,}, "
           f"by the fallback {a.accepted_by_provider.get('fallback', 0):,}, by both "
           f"{a.on_both_providers}"] if c.get("failover") else []),
        f"lost: {a.lost}",
        f"duplicates at the provider: {a.duplicates}",
        f"unexpected (accepted, never enqueued): {a.unexpected}",
        f"not exactly once in the database, terminal: {a.not_exactly_once_in_db}",
        f"sent but not accepted: {a.sent_not_accepted}; accepted but not sent: "
        f"{a.accepted_not_sent}",
        f"dead letters: {a.dead_letters} {a.dead_reasons}; unexplained: {a.dead_unexplained}; "
        f"injected rejects not dead: {a.rejects_not_dead}; missing dead-letter rows: "
        f"{a.dead_letter_rows_missing}",
        f"settled: {report.settled}; duration {report.duration_s:.0f}s",
    ]
    if a.examples:
        lines.append(f"examples: {a.examples}")
    verdict = "OK" if report.ok else f"VIOLATIONS {a.violations or 'not settled'}"
    lines.append("RESULT: " + verdict)
    return "\n".join(lines)


def markdown(report: ChaosReport, command: str) -> str:
    a = report.audit
    c = report.config
    reasons = ", ".join(f"{k} {v}" for k, v in a.dead_reasons.items())
    rows = [
        ("deliveries enqueued", f"{a.enqueued:,} ({int(c['upfront'] * 100)} % before the "
                                "workers start, the rest trickled during the faults)"),
        ("final states", ", ".join(f"{k} {v:,}" for k, v in sorted(a.states.items()))),
        ("worker SIGKILLs / restarts / exits by themselves",
         f"{report.kills} / {report.restarts} / {report.unexpected_exits}"),
        ("SIGSTOP past the lease", f"one worker for {report.stopped_for_s:g} s "
                                   f"(lease {c['lease_s']:g} s), then SIGCONT"),
        ("PostgreSQL restart", "yes" if report.pg_restarted else "no"),
        ("provider outage", f"{report.outage_s:g} s ({c['outage_mode']}, "
                            f"{report.sandbox_lives} sandbox lives)"),
        ("accept-then-timeout / 503 / rejected recipients",
         f"{c['timeout_rate']:.0%} (held {c['timeout_delay_s']:g} s, attempt timeout "
         f"{c['attempt_timeout_s']:g} s) / {c['error_rate']:.0%} / {c['rejects']}"),
        ("keys accepted by the provider", f"{a.provider_accepted:,}"),
        *([("failover: keys accepted by the primary / the fallback / both",
            f"{a.accepted_by_provider.get('primary', 0):,} / "
            f"{a.accepted_by_provider.get('fallback', 0):,} / **{a.on_both_providers}**")]
          if c.get("failover") else []),
        ("**lost** (enqueued, never terminal)", f"**{a.lost}**"),
        ("**duplicates** (a key accepted more than once)", f"**{a.duplicates}**"),
        ("**unexpected** (accepted, never enqueued)", f"**{a.unexpected}**"),
        ("not exactly once in the database", f"{a.not_exactly_once_in_db}"),
        ("sent but not accepted / accepted but not sent",
         f"{a.sent_not_accepted} / {a.accepted_not_sent}"),
        ("dead letters", f"{a.dead_letters} ({reasons or 'none'}); "
                         f"unexplained {a.dead_unexplained}, injected rejects not dead "
                         f"{a.rejects_not_dead}"),
        ("duration", f"{report.duration_s:.0f} s (settled: {report.settled})"),
        ("result", "**OK**" if report.ok else f"**VIOLATIONS** {a.violations}"),
    ]
    failover = bool(c.get("failover"))
    title = ("## Fault harness, failover: the primary provider down, a fallback takes over"
             if failover else
             "## Fault harness: kill -9, SIGSTOP, PostgreSQL restart, provider outage")
    return "\n".join([
        title,
        "",
        *([f"Every worker runs with `--fallback` (a second sandbox with its own journal, "
           f"`--fallback-rate {c['rate']:g}/s`); the outage is the primary's. The audit reads "
           "both journals as one: a key accepted by both providers counts as a duplicate.", ""]
          if failover else []),
        f"Command: `{command}` (`bench/chaos/run.py`). {c['workers']} `postlane worker` processes "
        f"(`--rate {c['rate']:g}/s` through Redis, `--lease {c['lease_s']:g}s`, "
        f"`--attempt-timeout {c['attempt_timeout_s']:g}s`, `--concurrency {c['concurrency']}`) "
        "against the sandbox over HTTP (`bench.chaos.sandbox`: the `postlane sandbox` app with "
        "its accepted keys journaled, so a restarted sandbox still remembers them), PostgreSQL.",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
        "Checked from the database and the provider's journal, as a queue checker would. "
        "Duplicates the provider suppressed by key are allowed (the contract: nothing that "
        "the provider can deduplicate is duplicated); a key on two journal lines is not.",
    ])


def main(argv: list[str] | None = None) -> int:
    from bench._common import command_line

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="the CI form (about a minute)")
    p.add_argument("--deliveries", type=int)
    p.add_argument("--kills", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--outage", type=float, help="seconds the provider is down")
    p.add_argument("--outage-mode", choices=["kill", "stop"])
    p.add_argument("--no-pg-restart", action="store_true")
    p.add_argument("--failover", action="store_true",
                   help="a fallback provider on every worker; the outage is the primary's")
    p.add_argument("--seed", type=int)
    p.add_argument("--keep", action="store_true", help="keep the logs")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.add_argument("--write", action="store_true", help="write the chaos section of RESULTS.md")
    a = p.parse_args(argv)
    config = ChaosConfig.short() if a.short else ChaosConfig()
    for name, value in (("deliveries", a.deliveries), ("kills", a.kills), ("workers", a.workers),
                        ("rate", a.rate), ("outage_s", a.outage), ("outage_mode", a.outage_mode),
                        ("seed", a.seed)):
        if value is not None:
            setattr(config, name, value)
    if a.no_pg_restart:
        config.pg_restart = False
    config.failover = a.failover
    report = run_chaos(config, keep=a.keep)
    print(summary(report))
    if a.json:
        a.json.write_text(json.dumps({"ok": report.ok, "report": asdict(report)}, indent=2,
                                     default=str))
    if a.write:
        from bench._common import write_section

        write_section("chaos-failover" if config.failover else "chaos",
                      markdown(report, command_line()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
