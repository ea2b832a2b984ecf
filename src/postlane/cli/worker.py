"""``postlane worker``, ``pause``, ``resume``: the dispatch side of the command line."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from datetime import timedelta
from typing import Annotated

import typer
from rich.markup import escape

from postlane import tracing
from postlane.callbacks import CallbackSender
from postlane.cli import options
from postlane.cli.durations import duration_option, lane_durations_option
from postlane.core.lanes import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LANES,
    LaneConfig,
    parse_lane_shares,
    with_bulk_lanes,
    with_lane_policies,
    with_lane_timings,
)
from postlane.core.rates import DEFAULT_HEADROOM, Limits, parse_limits, parse_rate
from postlane.core.unsubscribe import UnsubscribeConfig
from postlane.errors import ConfigurationError, MissingExtra
from postlane.limiter import DailyQuota, RateLimiter, open_limiter
from postlane.limiter.auto import QuotaShape, apply_limits, ceilings_of, follow_limits
from postlane.logs import configure_logging, log_effective_configuration
from postlane.providers.base import Provider, no_account_limits, reports_account_limits
from postlane.providers.registry import open_provider
from postlane.store import Store, open_store
from postlane.store.migrations import ensure_migrated
from postlane.worker import Worker, WorkerConfig
from postlane.worker.controls import pause_lane, resume_lane
from postlane.worker.drain import DEFAULT_DRAIN_TIMEOUT_S, DrainResult, drain_within

EXIT_DRAIN_GAVE_UP = 3
"""``worker --drain`` gave up after ``--drain-timeout``: not a crash, work is left waiting."""

def _lanes(text: str | None) -> tuple[LaneConfig, ...]:
    return tuple(parse_lane_shares(text)) if text else DEFAULT_LANES


def worker(
    ctx: typer.Context,
    provider: Annotated[str, typer.Option(**options.PROVIDER)],
    fallback: Annotated[list[str] | None, typer.Option(
        envvar="POSTLANE_FALLBACK", show_envvar=True,
        help="A provider URL to fail over to while the one before it is down (its breaker "
             "open, or account trouble); repeat for more, in order. Only what certainly did "
             "not reach a provider moves on (docs/failover.md).")] = None,
    fallback_rate: Annotated[list[str] | None, typer.Option(
        envvar="POSTLANE_FALLBACK_RATE", show_envvar=True,
        help="The ceiling of each --fallback, in the same order (200/s, 50000/d, "
             "14/s,50000/d; 'none' for no limit). Unset: no limit.")] = None,
    rate: Annotated[str | None, typer.Option(**options.RATE)] = None,
    quota_burst: Annotated[float, typer.Option(
        envvar="POSTLANE_QUOTA_BURST", show_envvar=True,
        help="Fraction of a daily quota that may go out back to back; the rest is paced "
             "evenly over 24 hours.")] = 0.25,
    quota_reserve: Annotated[float, typer.Option(
        envvar="POSTLANE_QUOTA_RESERVE", show_envvar=True,
        help="Fraction of that burst the bulk lane may not use: kept for interactive mail "
             "when the day's quota runs low.")] = 0.2,
    burst: Annotated[int, typer.Option(envvar="POSTLANE_BURST", show_envvar=True,
                                       help="Sends allowed back to back.")] = 1,
    headroom: Annotated[float, typer.Option(**options.HEADROOM)] = DEFAULT_HEADROOM,
    limiter: Annotated[str | None, typer.Option(**options.LIMITER)] = None,
    concurrency: Annotated[int, typer.Option(**options.CONCURRENCY)] = DEFAULT_CONCURRENCY,
    lanes: Annotated[str | None, typer.Option(**options.LANES)] = None,
    bulk_lanes: Annotated[str | None, typer.Option(**options.BULK_LANES)] = None,
    unsubscribe_url: Annotated[str | None, typer.Option(**options.UNSUBSCRIBE_URL)] = None,
    unsubscribe_mailto: Annotated[str | None, typer.Option(
        **options.UNSUBSCRIBE_MAILTO)] = None,
    unsubscribe_exempt: Annotated[str | None, typer.Option(
        envvar="POSTLANE_UNSUBSCRIBE_EXEMPT", show_envvar=True,
        help="Templates whose messages never carry List-Unsubscribe, even in a bulk lane "
             "(comma-separated).")] = None,
    batch_size: Annotated[int, typer.Option(envvar="POSTLANE_BATCH_SIZE", show_envvar=True,
                                            help="Most deliveries per claim.")] = 100,
    lease: Annotated[timedelta, duration_option(
        positive=True, envvar="POSTLANE_LEASE", show_envvar=True,
        help="Lease per claim, renewed while sending.")] = "30s",  # type: ignore[assignment]
    attempt_timeout: Annotated[str | None, lane_durations_option(
        envvar="POSTLANE_ATTEMPT_TIMEOUT", show_envvar=True,
        help="Hard bound on one send, per lane (interactive=3s,bulk=10s) or one duration for "
             "every lane; cut off there, it is transient if the request had not yet left "
             "(see docs/providers.md, phases), else ambiguous "
             "[default: interactive 3s, bulk 10s].")] = None,
    retry_base: Annotated[str | None, lane_durations_option(**options.RETRY_BASE)] = None,
    retry_cap: Annotated[str | None, lane_durations_option(**options.RETRY_CAP)] = None,
    retry_budget: Annotated[str | None, typer.Option(**options.RETRY_BUDGET)] = None,
    sms_fallback: Annotated[str | None, typer.Option(
        envvar="POSTLANE_SMS_FALLBACK", show_envvar=True,
        help="When an email that carries an SMS fallback gets it, per lane: triggers joined "
             "by +, from dead, expired and unsent@TIME (still unsent that long after "
             "enqueue), or none; e.g. interactive=dead+expired+unsent@2m,bulk=none "
             "[default: dead+expired].")] = None,
    grace: Annotated[timedelta, duration_option(
        positive=True, envvar="POSTLANE_GRACE", show_envvar=True,
        help="On SIGTERM, how long in-flight sends may finish.")
    ] = "10s",  # type: ignore[assignment]
    drain: Annotated[bool, typer.Option(
        help="Exit once nothing is pending or in flight.")] = False,
    callbacks: Annotated[bool, typer.Option(
        envvar="POSTLANE_CALLBACKS", show_envvar=True,
        help="Post the status callbacks the application registered (`postlane callbacks "
             "add`); every worker shares the work.")] = True,
    drain_timeout: Annotated[timedelta, duration_option(
        positive=True, envvar="POSTLANE_DRAIN_TIMEOUT", show_envvar=True,
        help="With --drain: give up after this long (a provider that stays down, an open "
             "breaker) and exit with status 3, saying what still waits.")
    ] = f"{DEFAULT_DRAIN_TIMEOUT_S / 60:g}m",  # type: ignore[assignment]
    metrics_port: Annotated[int | None, typer.Option(
        envvar="POSTLANE_METRICS_PORT", show_envvar=True,
        help="Serve this worker's Prometheus metrics (sends, dead letters, latencies) "
             "on this port.")] = None,
    metrics_addr: Annotated[str, typer.Option(
        envvar="POSTLANE_METRICS_ADDR", help="Address for --metrics-port.")] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(envvar="POSTLANE_LOG_LEVEL",
                                           help="DEBUG, INFO, WARNING...")] = "INFO",
) -> None:
    """Run a dispatch worker until SIGTERM/SIGINT (or, with --drain, until all is done)."""
    try:
        configure_logging(log_level, ctx.obj.log_format)
        lane_configs = with_lane_policies(
            with_lane_timings(_lanes(lanes), attempt_timeout=attempt_timeout,
                              retry_base=retry_base, retry_cap=retry_cap),
            retry_budget=retry_budget, sms_fallback=sms_fallback)
        if bulk_lanes is not None:
            lane_configs = with_bulk_lanes(lane_configs, bulk_lanes)
        exempt = {t.strip() for t in (unsubscribe_exempt or "").split(",") if t.strip()}
        config = WorkerConfig(
            concurrency=concurrency, batch_size=batch_size, lanes=lane_configs,
            lease=lease, grace_s=grace.total_seconds(), drain=drain,
            unsubscribe=UnsubscribeConfig.from_env(unsubscribe_url, unsubscribe_mailto, exempt),
        )
        limits = parse_limits(rate) if rate else None
        shape = QuotaShape(burst=quota_burst, reserve=quota_reserve)
        if not 0 <= headroom < 0.5:
            raise ConfigurationError("--headroom must be in [0, 0.5)")
        provider_obj = open_provider(provider)
        limiter_obj = None
        if limits is not None:
            if limits.auto:
                if not reports_account_limits(provider_obj):
                    raise ConfigurationError(no_account_limits(provider_obj))
            else:
                limiter_obj = _fixed_limiter(limits, provider_obj, limiter, burst=burst,
                                             headroom=headroom, shape=shape)
        elif limiter:
            raise ConfigurationError("--limiter needs --rate (the ceiling to enforce)")
        fallbacks = _fallbacks(fallback or [], fallback_rate or [], limiter, burst=burst,
                               headroom=headroom, shape=shape)
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc)) from None
    log_effective_configuration(logging.getLogger("postlane.worker"), "worker",
                                {"db": ctx.obj.db, **ctx.params})
    try:
        tracing.enable_from_env()  # POSTLANE_TRACING=otel
    except (ConfigurationError, MissingExtra) as exc:
        raise typer.BadParameter(str(exc), param_hint=tracing.ENV) from None

    async def _auto_limiter() -> RateLimiter:
        """The first read of the account's limits: a provider that cannot answer stops the
        start here, rather than a worker sending with no ceiling."""
        try:
            account = await provider_obj.account_limits()
        except Exception as exc:
            await provider_obj.close()
            if isinstance(exc, ConfigurationError):
                raise
            raise ConfigurationError(f"--rate auto: could not read the account's limits from "
                                     f"{provider_obj.name} ({type(exc).__name__}: {exc})") from exc
        per_second, quota = ceilings_of(account, headroom=headroom, shape=shape)
        made = open_limiter(limiter, rate=per_second, burst=burst, quota=quota,
                            account=provider_obj.account)
        await apply_limits(made, account, headroom=headroom, shape=shape)
        return made

    async def _run() -> DrainResult | None:
        nonlocal limiter_obj
        follower = None
        if limits is not None and limits.auto:
            limiter_obj = await _auto_limiter()
            follower = asyncio.create_task(follow_limits(
                limiter_obj, provider_obj.account_limits, headroom=headroom, shape=shape))
        async with open_store(ctx.obj.db) as store:
            ensure_migrated(await store.pending_migrations())
            sender = CallbackSender(store) if callbacks else None
            instance = Worker(store, provider_obj, limiter=limiter_obj, fallbacks=fallbacks,
                              callbacks=sender, config=config)
            exporter = None
            if metrics_port is not None:
                from postlane.metrics import WorkerMetrics

                exporter = WorkerMetrics(instance).serve(metrics_port, metrics_addr)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, instance.stop)
            _settle_heap()
            try:
                if drain:
                    return await drain_within(instance, drain_timeout.total_seconds())
                await instance.run()
                return None
            finally:
                if follower is not None:
                    follower.cancel()
                if exporter is not None:
                    exporter.shutdown()
                for made in [limiter_obj, *(lim for _, lim in fallbacks)]:
                    if made is not None:
                        await made.close()

    from postlane.cli.shell import err_console, run_async

    result = run_async(_run())
    if result is not None and not result.drained:
        err_console.print(f"[red]error:[/red] {escape(result.reason)}")
        raise typer.Exit(EXIT_DRAIN_GAVE_UP)


GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


def _settle_heap() -> None:
    """Tune the collector for this process, which only runs the worker: every send allocates
    dozens of short-lived objects (tasks, futures, records), so at the default threshold a
    collection ran every dozen sends, and the older generations' passes walked every object
    imported at start (modules, typer's and pydantic's classes), none of them ever garbage.
    Those are frozen out of the collector's sight, and the young generation collected ten
    times less often: a few hundred KiB more at most, and about a tenth less CPU per send
    (a drain of no-op sends). Not done by ``Worker`` itself: an application that embeds one
    keeps its own collector settings."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def _fixed_limiter(limits: Limits, provider: Provider, url: str | None, *, burst: int,
                   headroom: float, shape: QuotaShape) -> RateLimiter:
    """The limiter of a fixed ceiling (per second, per day or both), keyed by the account."""
    quota = (DailyQuota(limits.per_day, burst=shape.burst, reserve=shape.reserve)
             if limits.per_day is not None else None)
    per_second = limits.per_second * (1 - headroom) if limits.per_second is not None else None
    return open_limiter(url, rate=per_second, burst=burst, quota=quota, account=provider.account)


def _fallbacks(urls: list[str], rates: list[str], limiter: str | None, *, burst: int,
               headroom: float, shape: QuotaShape) -> list[tuple[Provider, RateLimiter | None]]:
    """The fallback providers, in order, each with its own ceiling (``--fallback-rate``)."""
    if len(rates) > len(urls):
        raise ConfigurationError(f"{len(rates)} --fallback-rate for {len(urls)} --fallback: "
                                 "give one rate per fallback, in the same order")
    made: list[tuple[Provider, RateLimiter | None]] = []
    for index, url in enumerate(urls):
        provider = open_provider(url)
        text = rates[index] if index < len(rates) else "none"
        if text.strip().lower() == "none":
            made.append((provider, None))
            continue
        limits = parse_limits(text)
        if limits.auto:
            raise ConfigurationError("--fallback-rate auto is not supported: give the "
                                     "fallback's ceiling (e.g. 50/s)")
        made.append((provider, _fixed_limiter(limits, provider, limiter, burst=burst,
                                              headroom=headroom, shape=shape)))
    return made


def pause(
    ctx: typer.Context,
    lane: Annotated[str, typer.Argument(help="The lane to pause.")],
    lanes: Annotated[str | None, typer.Option(envvar="POSTLANE_LANES",
                                              help="Configured lane shares.")] = None,
) -> None:
    """Stop claims of LANE on every worker within a second; nothing is deleted."""
    _check_lane(lane, lanes)

    async def _pause(store: Store) -> None:
        await pause_lane(store, lane)

    from postlane.cli.shell import console, run_with_store

    run_with_store(ctx, _pause)
    console.print(f"lane {lane} paused: workers stop claiming it within a second")


def resume(
    ctx: typer.Context,
    lane: Annotated[str, typer.Argument(help="The lane to resume.")],
    lanes: Annotated[str | None, typer.Option(envvar="POSTLANE_LANES",
                                              help="Configured lane shares.")] = None,
) -> None:
    """Let workers claim LANE again."""
    _check_lane(lane, lanes)

    async def _resume(store: Store) -> None:
        await resume_lane(store, lane)

    from postlane.cli.shell import console, run_with_store

    run_with_store(ctx, _resume)
    console.print(f"lane {lane} resumed")


def _check_lane(lane: str, lanes: str | None) -> None:
    try:
        names = [config.name for config in _lanes(lanes)]
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc)) from None
    if lane not in names:
        raise typer.BadParameter(f"unknown lane {lane!r} (configured: {', '.join(names)})")


__all__ = ["open_store", "parse_rate", "pause", "resume", "worker"]
