"""``postlane demo``: the whole pipeline on the embedded default, in under a minute.

A digest burst floods the bulk lane while password resets and verification codes arrive
in the interactive lane; the sandbox provider throttles, fails, times out after accepting,
and rejects a few addresses, like a real provider on a bad afternoon. The summary shows
what a user should check: interactive latency, the ceiling, duplicates, dead letters, the
one-click unsubscribe headers a bulk digest carried (signed with a secret made for the run),
and the SMS fallback of a reset whose email was refused (an SMS worker on
``sandbox-sms://`` runs beside the email worker and sends it as a delivery of its own).

Interactive latency is reported twice: for messages sent at their first claim, and for
those that needed another (a 503, a timeout, a throttle), since the two answer different
questions (is the queue fast? is a retry fast?). Enough interactive messages arrive for a
p99 of the first kind to mean something; the second kind is a few dozen, so its p99 is
close to its worst case.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from postlane.core.attachments import Attachment
from postlane.core.fallback import with_sms_fallback
from postlane.core.message import Message
from postlane.core.records import Stats
from postlane.core.unsubscribe import UnsubscribeConfig
from postlane.limiter import open_limiter
from postlane.providers.base import Provider
from postlane.providers.sandbox import SandboxConfig, SandboxProvider
from postlane.providers.sms import SandboxSmsProvider
from postlane.store.base import Store
from postlane.worker import Worker, WorkerConfig

DEMO_UNSUBSCRIBE_URL = "http://127.0.0.1:8080"
"""Where ``postlane serve`` listens by default (plain http is allowed on loopback only)."""
DEMO_UNSUBSCRIBE_MAILBOX = "unsubscribe@example.com"


@dataclass(frozen=True, slots=True)
class DemoPlan:
    bulk: int = 10_000
    interactive: int = 1200
    interactive_every_s: float = 0.02
    rejected_bulk: int = 5
    rejected_interactive: int = 2
    ceiling: float = 400.0
    headroom: float = 0.03


def default_sandbox(plan: DemoPlan) -> SandboxProvider:
    return SandboxProvider(SandboxConfig(
        rate=plan.ceiling, throttle_rate=0.0005, retry_after_s=0.5, error_rate=0.02,
        timeout_rate=0.005, reject=r"^bounce", seed=7,
    ))


@dataclass(frozen=True, slots=True)
class Latency:
    """Enqueue-to-send latency of a set of messages."""

    count: int = 0
    p50_s: float = 0.0
    p99_s: float = 0.0
    max_s: float = 0.0

    @classmethod
    def of(cls, seconds: list[float]) -> Latency:
        if not seconds:
            return cls()
        ordered = sorted(seconds)
        return cls(len(ordered), statistics.median(ordered),
                   ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], ordered[-1])

    def as_json(self) -> dict[str, Any]:
        return {"count": self.count, "p50_s": round(self.p50_s, 3),
                "p99_s": round(self.p99_s, 3), "max_s": round(self.max_s, 3)}

    def __str__(self) -> str:
        if not self.count:
            return "none"
        return (f"p50 {self.p50_s:.3f}s, p99 {self.p99_s:.3f}s, max {self.max_s:.3f}s "
                f"over {self.count}")


@dataclass
class DemoResult:
    sent: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    duplicates_suppressed: int = 0
    sms_fallbacks: list[dict[str, Any]] = field(default_factory=list)
    """Each email that fell back to SMS: its key, why, and the SMS delivery's fate."""
    ceiling_violations: int | None = None
    max_per_second: int | None = None
    interactive_p50_s: float = 0.0
    interactive_p99_s: float = 0.0
    interactive_max_s: float = 0.0
    first_try: Latency = field(default_factory=Latency)
    """Interactive messages sent at their first claim."""
    retried: Latency = field(default_factory=Latency)
    """Interactive messages sent after another claim (a failure, a throttle, a release)."""
    bulk_drain_s: float = 0.0
    elapsed_s: float = 0.0
    states: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    throttled: int = 0
    ambiguous: int = 0
    bulk_headers: dict[str, str] = field(default_factory=dict)
    """The unsubscribe headers a bulk message carried (``List-Unsubscribe``...)."""

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and not self.ceiling_violations and all(
            f["state"] == "sent" for f in self.sms_fallbacks) and (
            self.states.get("pending", 0) + self.states.get("sending", 0) == 0)

    def as_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent, "dead_letters": sum(self.dead_letters.values()),
            "dead_letter_reasons": self.dead_letters, "duplicates": self.duplicates,
            "duplicates_suppressed": self.duplicates_suppressed,
            "ceiling_violations": self.ceiling_violations,
            "max_per_second": self.max_per_second,
            "interactive_p50_s": round(self.interactive_p50_s, 3),
            "interactive_p99_s": round(self.interactive_p99_s, 3),
            "interactive_max_s": round(self.interactive_max_s, 3),
            "interactive_first_try": self.first_try.as_json(),
            "interactive_retried": self.retried.as_json(),
            "bulk_drain_s": round(self.bulk_drain_s, 2), "elapsed_s": round(self.elapsed_s, 2),
            "retries": self.retries, "throttled": self.throttled, "ambiguous": self.ambiguous,
            "states": self.states, "bulk_headers": self.bulk_headers,
            "sms_fallbacks": self.sms_fallbacks, "ok": self.ok,
        }


async def run_demo(store: Store, provider: Provider, plan: DemoPlan, console: Console,
                   *, live: bool = True) -> DemoResult:
    await store.migrate()
    _log_through(console)
    limiter = open_limiter(None, rate=plan.ceiling * (1 - plan.headroom))
    # The default lanes bring their own retry backoff and attempt timeout: interactive
    # retries within half a second, bulk backs off from a second up to minutes.
    # Digests are bulk mail: they carry one-click unsubscribe links to where `postlane serve`
    # would answer (docs/deliverability.md), signed with a secret made for this run.
    unsubscribe = UnsubscribeConfig((secrets.token_hex(32).encode(),), DEMO_UNSUBSCRIBE_URL,
                                    DEMO_UNSUBSCRIBE_MAILBOX)
    worker = Worker(store, provider, limiter=limiter, config=WorkerConfig(
        lease=timedelta(seconds=15), poll_interval_s=0.5, unsubscribe=unsubscribe,
    ))
    # The second channel: a worker of its own that claims SMS deliveries only.
    texts = Worker(store, SandboxSmsProvider(SandboxConfig(seed=7)), config=WorkerConfig(
        concurrency=4, batch_size=2, lease=timedelta(seconds=15), poll_interval_s=0.5,
        rescue_interval_s=0.5))
    started = time.monotonic()
    await _enqueue_bulk(store, plan)
    worker_task = asyncio.create_task(worker.run())
    texts_task = asyncio.create_task(texts.run())
    interactive_ids: list[int] = []
    producer = asyncio.create_task(_enqueue_interactive(store, plan, interactive_ids))
    bulk_done_at: float | None = None
    view = Live(console=console, refresh_per_second=4, transient=False) if live else None
    try:
        if view is not None:
            view.start()
        while True:
            stats = await store.stats()
            if bulk_done_at is None and stats.lanes.get("bulk") and \
                    stats.lanes["bulk"].depth == 0:
                bulk_done_at = time.monotonic()
            if view is not None:
                view.update(_render(stats, worker, time.monotonic() - started))
            active = stats.states["pending"] + stats.states["sending"]
            if producer.done() and active == 0:
                break
            if worker_task.done() or texts_task.done():
                for task in (worker_task, texts_task):  # a crashed worker ends the demo
                    if task.done():
                        task.result()
                break
            await asyncio.sleep(0.25)
    finally:
        if view is not None:
            view.stop()
        worker.stop()
        texts.stop()
        await worker_task
        await texts_task
        producer.cancel()
        await limiter.close()
    elapsed = time.monotonic() - started
    result = await _summarise(store, provider, plan, worker, interactive_ids,
                              (bulk_done_at or time.monotonic()) - started, elapsed)
    result.bulk_headers = await _bulk_headers(store, provider, plan, unsubscribe)
    return result


async def _bulk_headers(store: Store, provider: Provider, plan: DemoPlan,
                        unsubscribe: UnsubscribeConfig) -> dict[str, str]:
    """The unsubscribe pair of a digest: as the sandbox received it, or (another provider)
    as the worker built it for the first digest that was sent."""
    if isinstance(provider, SandboxProvider) and "bulk" in provider.sample_headers:
        sample = provider.sample_headers["bulk"]
        return {k: v for k, v in sample.items() if k.startswith("List-Unsubscribe")}
    delivery = await store.get(f"digest:2026-11:{plan.rejected_bulk}")
    if delivery is None:
        return {}
    return unsubscribe.for_recipient(delivery.recipient, delivery.lane, delivery.id).headers()


async def _enqueue_bulk(store: Store, plan: DemoPlan) -> None:
    messages = [
        Message(key=f"digest:2026-11:{i}",
                to=(f"bounce-{i}@example.com" if i < plan.rejected_bulk
                    else f"reader{i}@example.com"),
                subject="Your November digest", text=f"Hello reader {i}, here is your digest.",
                lane="bulk", metadata={"campaign": "digest-2026-11"})
        for i in range(plan.bulk)
    ]
    for start in range(0, len(messages), 2000):
        await store.enqueue_many(messages[start:start + 2000])


async def _enqueue_interactive(store: Store, plan: DemoPlan, ids: list[int]) -> None:
    await asyncio.sleep(1.0)  # let the bulk lane get going first
    for i in range(plan.interactive):
        if i < plan.rejected_interactive:
            to = f"bounce-user{i}@example.com"
        else:
            to = f"user{i}@example.com"
        kind = "reset" if i % 2 else "verify"
        if i == plan.rejected_interactive:  # one receipt, its PDF stored with it
            message = receipt(f"receipt:{i}", to, order=f"{4200 + i}")
        else:
            message = Message(
                key=f"{kind}:{i}", to=to, subject="Reset your password" if kind == "reset"
                else "Your verification code", text=f"Your code is {100000 + i}",
                lane="interactive", expires_in=timedelta(minutes=15),
            )
        if kind == "reset":  # should the email not arrive, the code goes by SMS
            message = with_sms_fallback(message, to=f"+1415555{i % 10000:04d}",
                                        text=f"Your password reset code is {100000 + i}")
        result = await store.enqueue(message)
        ids.append(result.id)
        await asyncio.sleep(plan.interactive_every_s)


def receipt(key: str, to: str, *, order: str) -> Message:
    """A receipt with its PDF attached, as a shop sends one after checkout."""
    return Message(
        key=key, to=to, subject=f"Your receipt for order {order}",
        text=f"Thank you for your order {order}. Your receipt is attached.",
        lane="interactive",
        attachments=(Attachment(f"receipt-{order}.pdf", receipt_pdf(order, "19.90 EUR"),
                                "application/pdf"),),
    )


def receipt_pdf(order: str, total: str) -> bytes:
    """A one-page PDF (PDF 1.4, Helvetica, no dependencies) with the cross-reference table
    a reader needs: small, but it opens in any viewer."""
    text = f"BT /F1 18 Tf 24 100 Td (Receipt {order}) Tj 0 -30 Td (Total: {total}) Tj ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 144] /Contents 4 0 R "
        "/Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(text)} >>\nstream\n{text}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += (f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n"
            "%%EOF\n").encode()
    return bytes(out)


def _log_through(console: Console) -> None:
    """Alerts (the breaker, a crashed task) print above the live view instead of through it.

    Dead letters are not alerts here: the demo makes them on purpose (the rejected
    addresses), the live view counts them and the summary lists their reasons; an ERROR
    line for each would read as a failure of the demo."""
    import logging

    from rich.logging import RichHandler

    logger = logging.getLogger("postlane")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=console, show_path=False, markup=False)
        handler.addFilter(lambda record: not str(record.msg).startswith("ALERT dead letter"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def _render(stats: Stats, worker: Worker, elapsed: float) -> Group:
    table = Table(title=f"postlane demo — {elapsed:5.1f}s", expand=False)
    for column in ("lane", "depth", "oldest age (s)"):
        table.add_column(column, justify="right" if column != "lane" else "left")
    for name, lane in sorted(stats.lanes.items()):
        table.add_row(name, str(lane.depth), f"{lane.oldest_age_s:.1f}")
    counters = worker.counters
    totals = Table.grid(padding=(0, 2))
    totals.add_row(
        f"sent {stats.states['sent']}",
        f"retries {counters['outcome:transient'] + counters['outcome:ambiguous']}",
        f"throttled {counters['outcome:throttled']}",
        f"dead letters {sum(stats.dead_letters.values())}",
        f"ambiguous outcomes {counters['outcome:ambiguous']}",
    )
    return Group(table, totals)


async def _summarise(store: Store, provider: Provider, plan: DemoPlan, worker: Worker,
                     interactive_ids: list[int], bulk_drain_s: float,
                     elapsed: float) -> DemoResult:
    stats = await store.stats()
    result = DemoResult(
        sent=stats.states["sent"], dead_letters=dict(stats.dead_letters),
        bulk_drain_s=bulk_drain_s, elapsed_s=elapsed, states=dict(stats.states),
        retries=worker.counters["outcome:transient"] + worker.counters["outcome:ambiguous"],
        throttled=worker.counters["outcome:throttled"],
        ambiguous=worker.counters["outcome:ambiguous"],
    )
    first_try: list[float] = []
    retried: list[float] = []
    for delivery_id in interactive_ids:
        delivery = await store.get(delivery_id)
        if delivery is not None and delivery.sent_at is not None:
            latency = (delivery.sent_at - delivery.created_at).total_seconds()
            (first_try if delivery.claims <= 1 else retried).append(latency)
    every = Latency.of(first_try + retried)
    result.interactive_p50_s, result.interactive_p99_s = every.p50_s, every.p99_s
    result.interactive_max_s = every.max_s
    result.first_try, result.retried = Latency.of(first_try), Latency.of(retried)
    for delivery_id in interactive_ids:
        pair = await store.sms_fallback_pair(delivery_id)
        if pair is None or pair.sms_id is None:
            continue
        email, sms = await store.get(pair.email_id), await store.get(pair.sms_id)
        if email is not None and sms is not None:
            result.sms_fallbacks.append({
                "email_key": email.key, "reason": pair.reason, "sms_key": sms.key,
                "state": str(sms.state), **sms.metadata.get("sms", {})})
    if isinstance(provider, SandboxProvider):
        seen = provider.engine.stats
        result.duplicates_suppressed = seen.duplicates_suppressed
        keys = provider.engine.accepted_keys()
        result.duplicates = seen.accepted - len(set(keys))
        result.max_per_second = max(seen.by_second.values(), default=0)
        result.ceiling_violations = sum(1 for n in seen.by_second.values() if n > plan.ceiling)
    return result


def print_summary(result: DemoResult, console: Console, db_url: str, *,
                  command: str = "postlane", timeline_key: str = "reset:3") -> None:
    """The summary, then commands to look further; ``command`` is how this shell runs
    postlane (``.venv/bin/postlane`` after the README's first command)."""
    console.print()
    console.rule("summary")
    console.print(f"sent {result.sent} in {result.elapsed_s:.1f}s; bulk lane drained in "
                  f"{result.bulk_drain_s:.1f}s")
    console.print(f"interactive enqueue-to-send latency: p50 {result.interactive_p50_s:.3f}s, "
                  f"p99 {result.interactive_p99_s:.3f}s, max {result.interactive_max_s:.3f}s")
    console.print(f"  sent at the first try: {result.first_try}")
    console.print(f"  sent after a retry:    {result.retried}")
    if result.ceiling_violations is not None:
        console.print(f"ceiling: at most {result.max_per_second} sends in any second at the "
                      f"provider; seconds over the ceiling: {result.ceiling_violations}")
    console.print(f"duplicates at the provider: {result.duplicates} "
                  f"({result.duplicates_suppressed} repeats suppressed by idempotency key)")
    console.print(f"retries {result.retries}, throttled {result.throttled}, "
                  f"ambiguous {result.ambiguous}")
    reasons = ", ".join(f"{k}={v}" for k, v in sorted(result.dead_letters.items())) or "none"
    console.print(f"dead letters: {sum(result.dead_letters.values())} ({reasons})")
    if result.bulk_headers:
        console.print("a bulk digest carried (one-click unsubscribe, RFC 8058; "
                      "docs/deliverability.md):")
        for name, value in result.bulk_headers.items():
            console.print(f"  {name}: {value}", markup=False, highlight=False, soft_wrap=True)
    falls = "; ".join(
        f"{f['email_key']} {f['reason']} -> {f['sms_key']} {f['state']} "
        f"({f.get('encoding', '?')}, {f.get('segments', '?')} segment(s))"
        for f in result.sms_fallbacks) or "none"
    console.print(f"SMS fallbacks: {len(result.sms_fallbacks)} ({falls})", markup=False,
                  highlight=False)
    console.print()
    console.print("next, try:")
    db = shlex.quote(db_url)
    for verb in ("status", f"timeline {shlex.quote(timeline_key)}", "dlq list"):
        console.print(f"  {command} --db {db} {verb}", markup=False, highlight=False,
                      soft_wrap=True)
