"""Pre-traffic checks: is this deployment ready to send? (``postlane check``)

Each check is a small function that returns *findings*: what was checked, whether it
passed, and in plain words what is wrong and what to do about it. ``run_checks`` runs them
all (the I/O ones concurrently, each with a deadline) and never stops at the first problem:
an operator fixing a new host wants the whole list at once.

What is checked, and why it matters before traffic:

- **database**: reachable, and the schema is fully migrated (a worker refuses to start
  otherwise, and an API host would fail every enqueue);
- **limiter**: the Redis that shares the provider ceiling answers (a worker that cannot
  reach it fails closed and sends nothing);
- **provider**: the URL is understood, the adapter opens and closes, and, when the adapter
  has a no-send probe (``async def check(self) -> str | None``), the provider accepts the
  credentials; without a probe, something answers at its endpoint (a TCP connect, nothing
  sent: a connect timeout or a refused connection fails); an adapter that needs a sender
  has one (``from=``) for messages that name none;
- **lanes**: the shares add up to 100 % and each lane gets at least one slot;
- **retry budget**: each lane's expected backoff over its attempts fits in its retry budget
  (by default two-thirds of its expiry; ``--retry-budget``), where the worker stops retrying,
  so retries end while the message (a reset link...) is still useful;
- **rate**: the ceiling is a positive rate, and the headroom below it is sane.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from postlane.core.durations import parse_duration
from postlane.core.lanes import (
    DEFAULT_CONCURRENCY,
    DEFAULT_LANES,
    LaneConfig,
    slot_floors,
    with_bulk_lanes,
    with_lane_policies,
    with_lane_timings,
)
from postlane.core.policy import RetryPolicy, backoff_s, lane_policy
from postlane.core.rates import DEFAULT_HEADROOM, parse_limits
from postlane.core.redaction import redact_url
from postlane.core.unsubscribe import UnsubscribeConfig
from postlane.errors import (
    ConfigurationError,
    MissingExtra,
    PostlaneError,
    StoreError,
    StoreUnavailable,
)
from postlane.limiter import open_limiter
from postlane.providers.base import Provider
from postlane.providers.registry import open_provider
from postlane.store import open_store, plain_url
from postlane.store.migrations import load
from postlane.store.probe import probe_postgres, sqlite_applied

Status = Literal["ok", "warn", "fail"]

BUDGET_FRACTION = 2 / 3
"""The default of ``LaneConfig.retry_budget``: a lane's expected retries must fit in this
fraction of its expiry (the seed text: "roughly two-thirds of the token lifetime"), leaving
the rest for the send and the reader. The worker enforces each lane's own fraction
(``core.policy``); this check says ahead of time when retries would be cut short."""
DEFAULT_TIMEOUT_S = 5.0
PROVIDER_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    """What was checked: ``database``, ``migrations``, ``limiter``, ``provider``, ``lanes``,
    ``retry budget``, ``unsubscribe``, ``rate``."""
    status: Status
    message: str
    """What was found, in plain words."""
    hint: str | None = None
    """What to do about it (a command to run, an option to change)."""

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def as_json(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "message": self.message,
                "hint": self.hint}


class ProviderProbe(Protocol):
    """The optional no-send probe a provider adapter may offer (read with ``getattr``, so
    ``Provider`` itself does not change): EHLO + AUTH for SMTP, an authenticated read-only
    request for an HTTP API. Called between ``open()`` and ``close()``.

    Returns ``None`` when the provider accepted the credentials, else what is wrong in plain
    words ("535 authentication failed for user ops@..."). It may also raise."""

    async def check(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class CheckSettings:
    """What a worker would run with: the same values ``postlane worker`` reads."""

    db: str
    provider: str | None = None
    rate: str | None = None
    limiter: str | None = None
    lanes: str | Sequence[LaneConfig] | None = None
    """``interactive=70,bulk=30`` as given to the worker, or lane configs (tests, embedding)."""
    lane_expiry: str | None = None
    """``interactive=15m,bulk=24h``: the usefulness window of each lane's messages, when it
    differs from the lane's default expiry."""
    retry_base: str | None = None
    """``interactive=250ms,bulk=1s`` as given to the worker: each lane's backoff base."""
    retry_cap: str | None = None
    """``interactive=30s,bulk=5m`` as given to the worker: each lane's longest backoff."""
    retry_budget: str | None = None
    """``interactive=0.5`` as given to the worker: the fraction of each lane's validity window
    its retries may use."""
    headroom: float = DEFAULT_HEADROOM
    concurrency: int = DEFAULT_CONCURRENCY
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_s: float = DEFAULT_TIMEOUT_S
    provider_timeout_s: float = PROVIDER_TIMEOUT_S
    skip: frozenset[str] = frozenset()
    """Groups not to check (``SKIPPABLE``): an API host has no provider secrets to test."""
    bulk_lanes: str | None = None
    """``--bulk-lanes`` as given to the worker (None: the lanes' own flags)."""
    unsubscribe_url: str | None = None
    """``--unsubscribe-url`` as given to the worker (None: ``POSTLANE_UNSUBSCRIBE_URL``)."""
    unsubscribe_mailto: str | None = None


SKIPPABLE = ("database", "limiter", "provider", "rate", "lanes")
"""What ``skip`` may name: ``database`` covers migrations, ``lanes`` the retry budgets."""


async def run_checks(settings: CheckSettings) -> list[Finding]:
    """Every check, in a stable order; the I/O checks run concurrently."""
    unknown = sorted(settings.skip - set(SKIPPABLE))
    if unknown:
        raise ConfigurationError(f"cannot skip {', '.join(unknown)}: the checks are "
                                 f"{', '.join(SKIPPABLE)}")
    run = {name: name not in settings.skip for name in SKIPPABLE}
    provider_findings: list[Finding] = []
    provider: Provider | None = None
    if run["provider"] or run["limiter"]:  # the limiter's key is the provider's account
        provider_findings, provider = build_provider(settings.provider)
    ceiling, rate_findings = check_rate(settings.rate, settings.headroom)
    lanes, lane_findings = lane_configs(settings.lanes, settings.lane_expiry,
                                        retry_base=settings.retry_base,
                                        retry_cap=settings.retry_cap,
                                        retry_budget=settings.retry_budget)
    account = provider.account if provider is not None else None

    database, limiter, probe = await asyncio.gather(
        check_database(settings.db, timeout_s=settings.timeout_s)
        if run["database"] else _nothing(),
        check_limiter(settings.limiter, ceiling=ceiling, account=account,
                      rate_given=bool(settings.rate and settings.rate.strip()),
                      timeout_s=settings.timeout_s) if run["limiter"] else _nothing(),
        check_provider(provider, timeout_s=settings.provider_timeout_s)
        if provider is not None and run["provider"] else _nothing(),
    )
    findings = [*database, *limiter]
    if run["provider"]:
        findings += [*provider_findings, *probe]
    if run["rate"]:
        findings += rate_findings
    if run["lanes"]:
        findings += lane_findings
        if lanes:
            findings.append(check_lane_shares(lanes, settings.concurrency))
            findings.extend(check_retry_budgets(lanes, settings.policy))
            findings.append(check_unsubscribe(lanes, settings.bulk_lanes,
                                              settings.unsubscribe_url,
                                              settings.unsubscribe_mailto))
    return findings


async def _nothing() -> list[Finding]:
    return []


# -- database ----------------------------------------------------------------------------
async def check_database(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Finding]:
    """Reachable, and fully migrated (naming the pending migrations and the command)."""
    url = plain_url(url)
    shown = safe_redact(url)
    try:
        scheme = urlsplit(url).scheme
        if scheme not in ("sqlite", "postgresql"):
            open_store(url)  # raises the store's own explanation
    except (ConfigurationError, ValueError) as exc:
        return [Finding("database", "fail", f"the database URL is not usable: {exc}",
                        "give --db (or POSTLANE_DATABASE_URL) as postgresql://user@host/db")]
    if scheme == "sqlite":
        reached, applied = await _sqlite_applied(url)
    else:
        reached, applied = await _postgres_applied(url, timeout_s)
    if reached.failed or applied is None:
        return [reached]
    findings = [reached]
    try:
        async with asyncio.timeout(timeout_s * 2):
            async with open_store(url, pool_size=1) as store:
                pending = await store.pending_migrations()
    except (PostlaneError, TimeoutError) as exc:
        findings.append(Finding("migrations", "fail",
                                f"could not read the schema version: {_one_line(exc)}"))
        return findings
    engine = "sqlite" if scheme == "sqlite" else "postgres"
    known = {m.version for m in load(engine)}
    if pending:
        findings.append(Finding(
            "migrations", "fail",
            f"the schema is behind this Postlane: {len(pending)} of {len(known)} migrations "
            f"pending ({', '.join(pending)}); workers refuse to start and enqueues fail",
            f"run once, from any one host: postlane --db '{shown}' migrate",
        ))
    else:
        findings.append(Finding("migrations", "ok",
                                f"schema up to date ({len(known)} migrations applied)"))
    newer = sorted(v for v in applied if v not in known)
    if newer:
        findings.append(Finding(
            "migrations", "warn",
            f"the database has migrations this Postlane does not know "
            f"({', '.join(f'{v:04d}' for v in newer)}): a newer version migrated it",
            "upgrade this host to the version the other hosts run",
        ))
    if scheme == "sqlite":
        findings.append(Finding(
            "database", "warn", "SQLite serves processes on this one host only",
            "for several worker or API hosts use PostgreSQL (docs/deployment.md)"))
    return findings


async def _postgres_applied(url: str, timeout_s: float) -> tuple[Finding, set[int] | None]:
    where = _pg_where(url)
    try:
        probe = await probe_postgres(url, timeout_s=timeout_s)
    except MissingExtra as exc:
        return Finding("database", "fail", str(exc)), None
    except StoreUnavailable as exc:
        return Finding(
            "database", "fail", f"cannot reach PostgreSQL at {where}: {_one_line(exc)}",
            "check host, port, database name and credentials, and that the server accepts "
            "this host (listen_addresses, pg_hba.conf, firewalls)",
        ), None
    except StoreError as exc:
        return Finding("database", "fail",
                       f"PostgreSQL at {where} answered with an error: {_one_line(exc)}"), None
    return Finding(
        "database", "ok",
        f"PostgreSQL {probe.server_version} reachable at {where} "
        f"(max_connections {probe.max_connections}, {probe.connections_in_use} in use)",
    ), set(probe.applied)


async def _sqlite_applied(url: str) -> tuple[Finding, set[int] | None]:
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not path:
        return Finding("database", "fail",
                       f"SQLite URL needs a path: sqlite:///relative.db or sqlite:////abs/path "
                       f"(got {url!r})"), None
    if not os.path.exists(path):
        return Finding("database", "fail",
                       f"the SQLite database {path} does not exist (nothing migrated it yet)",
                       f"run: postlane --db '{url}' migrate"), None
    try:
        applied = await sqlite_applied(path)
    except StoreError as exc:
        return Finding("database", "fail",
                       f"cannot read the SQLite database {path}: {_one_line(exc)}"), None
    return Finding("database", "ok", f"SQLite database {path} readable"), set(applied)


def _pg_where(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or "(local socket)"
        port = parts.port or 5432
    except ValueError:
        return safe_redact(url)
    return f"{host}:{port}{parts.path or '/'}"


# -- limiter -----------------------------------------------------------------------------
async def check_limiter(
    url: str | None, *, ceiling: float | None, account: str | None,
    rate_given: bool | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Finding]:
    """The shared limiter answers a PING and its scripts run (read-only: the gate).

    ``rate_given``: whether a rate was configured at all (it may be unusable, which the rate
    check reports); by default, whether ``ceiling`` is set."""
    if rate_given is None:
        rate_given = ceiling is not None
    if url is None or url.strip().lower().startswith("memory:"):
        if not rate_given:
            return []
        return [Finding(
            "limiter", "warn",
            "in-process limiter: the ceiling holds only while this is the only worker "
            "process sending for this provider account",
            "with several workers or hosts, give every one --limiter redis://host:6379/0",
        )]
    shown = safe_redact(url)
    findings: list[Finding] = []
    if not rate_given:
        findings.append(Finding("limiter", "fail",
                                f"--limiter {shown} is set but --rate is not: the worker "
                                "refuses to start (there is no ceiling to enforce)",
                                "set --rate (POSTLANE_RATE) to the provider account's ceiling"))
    try:
        limiter = open_limiter(url, rate=ceiling or 1.0, account=account or "default")
    except (ConfigurationError, MissingExtra) as exc:
        return [*findings, Finding("limiter", "fail", str(exc))]
    from redis.asyncio import Redis  # open_limiter has imported it: redis:// works
    from redis.exceptions import RedisError

    try:
        client = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    except ValueError as exc:
        await limiter.close()
        return [*findings, Finding("limiter", "fail", f"cannot use limiter URL {shown}: {exc}")]
    try:
        async with asyncio.timeout(timeout_s * 2):
            await client.ping()
            gate = await limiter.gate_remaining_s()
    except (RedisError, OSError, TimeoutError) as exc:
        return [*findings, Finding(
            "limiter", "fail",
            f"cannot reach the limiter's Redis at {shown}: {_one_line(exc) or 'timed out'}; "
            "a worker that cannot reach it sends nothing (it fails closed)",
            "check host, port, password and that Redis accepts this host (bind, protected-mode)",
        )]
    finally:
        await client.aclose()
        await limiter.close()
    findings.append(Finding("limiter", "ok",
                            f"Redis at {shown} answers; one ceiling for account "
                            f"{account or 'default'!r} shared by every worker using it"))
    if gate > 0:
        findings.append(Finding(
            "limiter", "warn",
            f"the provider account's gate is closed for another {gate:.1f} s (a 429 with "
            "Retry-After); nothing is sent until it opens"))
    return findings


# -- provider ----------------------------------------------------------------------------
def build_provider(url: str | None) -> tuple[list[Finding], Provider | None]:
    """Construct the adapter a URL names (nothing connects yet)."""
    if not url:
        return [Finding("provider", "fail", "no provider is configured",
                        "give --provider (POSTLANE_PROVIDER, or provider in the [worker] "
                        "table of the configuration file)")], None
    try:
        return [], open_provider(url)
    except (ConfigurationError, ValueError) as exc:
        return [Finding("provider", "fail",
                        f"the provider URL {safe_redact(url)} is not usable: {exc}",
                        "see docs/providers.md for the URL of each adapter")], None


async def check_provider(provider: Provider,
                         *, timeout_s: float = PROVIDER_TIMEOUT_S) -> list[Finding]:
    """Open the adapter, run its no-send probe when it has one (else see that something
    answers at its endpoint), close it; and see that it has a sender for messages with
    none of their own."""
    what = f"{provider.name} (account {provider.account!r})"
    return [*check_sender(provider, what), *await _reach_provider(provider, what, timeout_s)]


def check_sender(provider: Provider, what: str | None = None) -> list[Finding]:
    """A provider that needs a sender and has no ``from=``: every message that names no
    sender of its own would stop the account (account-level trouble), not be sent."""
    if not provider.needs_sender or provider.configured_sender():
        return []
    what = what or f"{provider.name} (account {provider.account!r})"
    return [Finding(
        "provider", "fail",
        f"provider {what} has no sender: its URL names no from= address, so a message that "
        "names no sender of its own is not sent (the breaker opens for account trouble)",
        "add from=noreply@your-domain (an address the provider has verified) to the "
        "provider URL",
    )]


async def check_endpoint(host: str, port: int, timeout_s: float) -> str | None:
    """Open a TCP connection to ``host:port`` and close it (nothing is sent): None when
    something answered, else what happened, in plain words."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return (f"nothing answers at {host}:{port}: no connection within {timeout_s:g} s "
                "(connect timeout; a firewall dropping packets, or a wrong host)")
    except ConnectionRefusedError:
        return f"nothing answers at {host}:{port}: connection refused (nothing listens there)"
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {_one_line(exc) or type(exc).__name__}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def _reach_provider(provider: Provider, what: str, timeout_s: float) -> list[Finding]:
    probe: Callable[[], Awaitable[str | None]] | None = getattr(provider, "check", None)
    endpoint = None if callable(probe) else provider.endpoint()
    problem: str | None = None
    try:
        async with asyncio.timeout(timeout_s):
            await provider.open()
            try:
                if callable(probe):
                    problem = await probe()
            finally:
                await provider.close()
    except TimeoutError:
        problem = f"no answer within {timeout_s:g} s"
    except Exception as exc:  # an adapter's failure to open is exactly what we look for
        problem = f"{type(exc).__name__}: {_one_line(exc)}"
    if problem is None and endpoint is not None:
        problem = await check_endpoint(*endpoint, timeout_s=timeout_s)
        if problem is not None:
            return [Finding("provider", "fail", f"provider {what}: {problem}",
                            "check the host and port of the provider URL, and that this "
                            "host may reach them (firewall, proxy, DNS)")]
    if problem is not None:
        return [Finding("provider", "fail", f"provider {what}: {problem}",
                        "check the provider URL and the credentials it reads from the "
                        "environment (POSTLANE_SMTP_PASSWORD, API keys...)")]
    if callable(probe):
        return [Finding("provider", "ok",
                        f"provider {what} accepted the credentials (no message sent)")]
    reached = f"answers at {endpoint[0]}:{endpoint[1]}" if endpoint else "opens and closes"
    return [Finding("provider", "ok",
                    f"provider {what} {reached}; no probe available, so the "
                    "credentials are first tested by a real send")]


# -- rate --------------------------------------------------------------------------------
def check_rate(text: str | None, headroom: float = DEFAULT_HEADROOM,
               ) -> tuple[float | None, list[Finding]]:
    """The per-second ceiling (None when unset, unusable, daily only or auto) and the findings."""
    findings: list[Finding] = []
    if not (math.isfinite(headroom) and 0 <= headroom < 0.5):
        findings.append(Finding("rate", "fail",
                                f"--headroom {headroom!r} is outside [0, 0.5)",
                                f"leave it at {DEFAULT_HEADROOM} unless the provider counts "
                                "loosely"))
    if text is None or not text.strip():
        findings.append(Finding(
            "rate", "warn",
            "no --rate: no ceiling is enforced, so the provider's own limit answers with 429s "
            "(they requeue without spending attempts, but cost round trips)",
            "set --rate to the provider account's documented ceiling, e.g. 200/s"))
        return None, findings
    try:
        limits = parse_limits(text)
    except ConfigurationError:
        findings.append(Finding("rate", "fail",
                                f"the rate {text!r} is not a positive number of sends per "
                                "second, minute or day, a pair (14/s,50000/d) or auto",
                                "write it as 200/s, 12000/m, 50000/d, 14/s,50000/d or auto"))
        return None, findings
    if limits.auto:
        findings.append(Finding("rate", "ok", "ceilings read from the provider's account at "
                                              "start and every 5 minutes (--rate auto)"))
        return None, findings
    ceiling = limits.per_second
    parts = []
    if ceiling is not None:
        plan = (f"; workers plan {ceiling * (1 - headroom):g}/s ({headroom:.0%} headroom)"
                if not findings else "")
        parts.append(f"ceiling {ceiling:g}/s{plan}")
    if limits.per_day is not None:
        parts.append(f"daily quota {limits.per_day} per 24 h")
    findings.append(Finding("rate", "ok", f"{', '.join(parts)}, shared by every "
                                          "process that uses the same limiter"))
    return ceiling, findings


# -- lanes -------------------------------------------------------------------------------
def lane_configs(
    lanes: str | Sequence[LaneConfig] | None, expiry: str | None = None, *,
    retry_base: str | None = None, retry_cap: str | None = None,
    retry_budget: str | None = None,
) -> tuple[list[LaneConfig], list[Finding]]:
    """The lanes a worker would run, parsed leniently: bad shares are findings, not errors,
    so the remaining checks still run. ``expiry`` (``interactive=15m``) overrides the
    default expiry of the lanes it names; ``retry_base`` and ``retry_cap`` their backoff."""
    findings: list[Finding] = []
    configs: list[LaneConfig] = []
    if lanes is None:
        configs = list(DEFAULT_LANES)
    elif isinstance(lanes, str):
        by_name = {lane.name: lane for lane in DEFAULT_LANES}
        for part in lanes.split(","):
            name, sep, pct = part.strip().partition("=")
            name = name.strip()
            try:
                share = float(pct) / 100 if sep and name else math.nan
            except ValueError:
                share = math.nan
            if not math.isfinite(share) or not 0 < share <= 1:
                findings.append(Finding("lanes", "fail",
                                        f"lane share {part.strip()!r} is not NAME=PERCENT "
                                        "with a percentage in (0, 100]",
                                        "write it as interactive=70,bulk=30"))
                continue
            template = by_name.get(name, LaneConfig(name, 0.0))
            configs.append(replace(template, name=name, share=share))
    else:
        configs = list(lanes)
    if expiry:
        configs, more = _with_expiry(configs, expiry)
        findings.extend(more)
    if configs and (retry_base or retry_cap):
        try:
            configs = list(with_lane_timings(configs, retry_base=retry_base,
                                             retry_cap=retry_cap))
        except ConfigurationError as exc:
            findings.append(Finding("lanes", "fail", str(exc)))
    if configs and retry_budget:
        try:
            configs = list(with_lane_policies(configs, retry_budget=retry_budget))
        except ConfigurationError as exc:
            findings.append(Finding("lanes", "fail", str(exc)))
    return configs, findings


def _with_expiry(lanes: list[LaneConfig],
                 text: str) -> tuple[list[LaneConfig], list[Finding]]:
    by_name = {lane.name: lane for lane in lanes}
    findings: list[Finding] = []
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not sep or name not in by_name:
            findings.append(Finding("lanes", "fail",
                                    f"lane expiry {part.strip()!r} does not name a configured "
                                    f"lane ({', '.join(by_name)})",
                                    "write it as interactive=15m,bulk=24h"))
            continue
        try:
            window = parse_duration(value)
        except ValueError as exc:
            findings.append(Finding("lanes", "fail", f"lane expiry {part.strip()!r}: {exc}"))
            continue
        lane = by_name[name]
        by_name[name] = replace(lane, default_expiry=window)
    return [by_name[lane.name] for lane in lanes], findings


def check_lane_shares(lanes: Sequence[LaneConfig], concurrency: int = 100) -> Finding:
    """The shares add up to 100 %, names do not repeat, every lane gets a slot."""
    names = [lane.name for lane in lanes]
    table = ", ".join(f"{lane.name}={lane.share * 100:g}" for lane in lanes)
    total = sum(lane.share for lane in lanes)
    if len(set(names)) != len(names):
        return Finding("lanes", "fail", f"lane names repeat: {table}")
    if abs(total - 1.0) > 1e-6:
        return Finding("lanes", "fail",
                       f"lane shares add up to {total * 100:g} %, not 100 % ({table}): the "
                       "worker refuses to start",
                       "make the percentages of --lanes (POSTLANE_LANES) add up to 100")
    bad = [lane.name for lane in lanes if lane.max_attempts < 1]
    if bad:
        return Finding("lanes", "fail", f"max_attempts below 1 for {', '.join(bad)}")
    try:
        floors = slot_floors(lanes, concurrency)
    except ConfigurationError as exc:
        return Finding("lanes", "fail", str(exc), "raise --concurrency")
    slots = ", ".join(f"{name} {floor}" for name, floor in floors.items())
    return Finding("lanes", "ok",
                   f"shares add up to 100 % ({table}); reserved slots of {concurrency}: {slots}")


def check_unsubscribe(lanes: Sequence[LaneConfig], bulk_lanes: str | None,
                      url: str | None, mailto: str | None) -> Finding:
    """Bulk lanes' mail will carry signed one-click unsubscribe links (docs/deliverability.md):
    a URL and a usable secret are configured, or there is no bulk lane."""
    try:
        if bulk_lanes is not None:
            lanes = with_bulk_lanes(lanes, bulk_lanes)
        bulk = [lane.name for lane in lanes if lane.bulk]
        config = UnsubscribeConfig.from_env(url, mailto)
    except ConfigurationError as exc:
        return Finding("unsubscribe", "fail", f"{exc}: the worker refuses to start",
                       "see docs/deliverability.md")
    if not bulk:
        return Finding("unsubscribe", "ok", "no bulk lane: no message carries "
                                            "List-Unsubscribe")
    if config is None:
        return Finding("unsubscribe", "warn",
                       f"bulk lane(s) {', '.join(bulk)} would send without List-Unsubscribe "
                       "(bulk senders must offer one-click unsubscribe)",
                       "set --unsubscribe-url (POSTLANE_UNSUBSCRIBE_URL) and "
                       "POSTLANE_UNSUBSCRIBE_SECRET")
    return Finding("unsubscribe", "ok",
                   f"bulk lane(s) {', '.join(bulk)} carry one-click unsubscribe to "
                   f"{config.base_url}/unsubscribe/..."
                   + (f" and mailto:{config.mailbox}" if config.mailbox else ""))


def expected_retry_budget_s(lane: LaneConfig, policy: RetryPolicy = RetryPolicy()) -> float:
    """The expected total backoff of a lane's retries (with its own base and cap where it
    sets them): after each of the first ``max_attempts - 1`` attempts, full jitter waits
    half its ceiling on average."""
    policy = lane_policy(lane, policy)
    return sum(backoff_s(k, policy, lambda: 0.5) for k in range(1, lane.max_attempts))


def worst_retry_budget_s(lane: LaneConfig, policy: RetryPolicy = RetryPolicy()) -> float:
    """The longest total backoff (every jitter draw at its ceiling)."""
    policy = lane_policy(lane, policy)
    return sum(backoff_s(k, policy, lambda: 1.0) for k in range(1, lane.max_attempts))


def check_retry_budgets(lanes: Sequence[LaneConfig],
                        policy: RetryPolicy = RetryPolicy()) -> list[Finding]:
    """Each lane's retries end within about two-thirds of its expiry."""
    findings = []
    for lane in lanes:
        expected = expected_retry_budget_s(lane, policy)
        worst = worst_retry_budget_s(lane, policy)
        spent = (f"{lane.max_attempts} attempts wait about {human(expected)} of backoff "
                 f"between them (at most {human(worst)})")
        if lane.default_expiry is None:
            findings.append(Finding("retry budget", "ok",
                                    f"lane {lane.name}: no expiry; {spent}"))
            continue
        expiry = lane.default_expiry.total_seconds()
        limit = expiry * lane.retry_budget
        share = _fraction(lane.retry_budget)
        if expected > limit:
            findings.append(Finding(
                "retry budget", "fail",
                f"lane {lane.name}: {spent}, more than {share} of its {human(expiry)} "
                f"expiry ({human(limit)}): the last retries would deliver messages nobody can "
                "use any more (a reset link that has expired) instead of failing while the "
                "user can still ask for a fresh one",
                f"lower the lane's max_attempts or lengthen its expiry to at least "
                f"{human(expected / lane.retry_budget)} (the worker stops retrying at "
                f"{share} of it)",
            ))
        else:
            findings.append(Finding("retry budget", "ok",
                                    f"lane {lane.name}: {spent}, within {share} of its "
                                    f"{human(expiry)} expiry"))
    return findings


# -- wording -----------------------------------------------------------------------------
def _fraction(value: float) -> str:
    """``two-thirds`` for the default retry budget, else a percentage."""
    return "two-thirds" if abs(value - BUDGET_FRACTION) < 1e-9 else f"{value:.0%}"


def human(seconds: float) -> str:
    """``31 s``, ``10 min 20 s``, ``2 h 7 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min" + (f" {sec} s" if sec else "")
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


def safe_redact(url: str) -> str:
    try:
        return redact_url(url)
    except ValueError:
        return "<unparseable URL>"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def summary(findings: Sequence[Finding]) -> str:
    failed = sum(f.failed for f in findings)
    warned = sum(f.status == "warn" for f in findings)
    if failed:
        return (f"{failed} problem{'s' if failed != 1 else ''} found: fix "
                f"{'them' if failed != 1 else 'it'} before this deployment takes traffic")
    note = f" ({warned} warning{'s' if warned != 1 else ''})" if warned else ""
    return f"all checks passed{note}: ready for traffic"


__all__ = [
    "BUDGET_FRACTION",
    "SKIPPABLE",
    "CheckSettings",
    "Finding",
    "ProviderProbe",
    "build_provider",
    "check_database",
    "check_endpoint",
    "check_lane_shares",
    "check_limiter",
    "check_provider",
    "check_rate",
    "check_retry_budgets",
    "check_sender",
    "expected_retry_budget_s",
    "human",
    "lane_configs",
    "run_checks",
    "summary",
    "worst_retry_budget_s",
]
