"""The fault harness's short form (``python -m bench.chaos --short``) as a test.

2,000 deliveries through the sandbox over HTTP (5 % accept-then-timeout, 1 % 503, 40
recipients rejected) by two ``postlane worker`` processes sharing 200/s through Redis, while
a driver SIGKILLs a worker three times (restarting it), SIGSTOPs one past its lease and
SIGCONTs it, and takes the provider down for 5 s (SIGKILL, then a new sandbox on the same
port that reloads its journal of accepted keys). No PostgreSQL restart here: the long run
(``python -m bench.chaos``) does that. Then the queue checker's audit: nothing lost, no key
accepted twice by the provider, nothing unexpected, every delivery exactly once and terminal,
sent <=> accepted, and the dead letters are exactly the rejected recipients.
"""

from __future__ import annotations

import pytest

from bench.chaos.run import ChaosConfig, run_chaos, summary

from .conftest import FIGURES

pytestmark = pytest.mark.slow


def test_short_fault_harness_loses_and_duplicates_nothing() -> None:
    config = ChaosConfig.short()
    report = run_chaos(config, log=lambda line: print(line, flush=True))
    text = summary(report)
    print(text)
    a = report.audit
    FIGURES["fault harness (short)"] = (
        f"{a.enqueued} deliveries, {report.kills} kills, lost {a.lost}, duplicates "
        f"{a.duplicates}, unexpected {a.unexpected}, dead {a.dead_letters} "
        f"(unexplained {a.dead_unexplained}), {report.duration_s:.0f}s")
    assert report.kills == config.kills, text
    assert report.stopped_for_s > config.lease_s, text
    assert report.sandbox_lives == 2, text
    assert report.settled, text
    assert a.enqueued == config.deliveries, text
    assert a.violations == {}, text
    assert a.dead_letters == config.rejects, text


def test_short_fault_harness_with_failover_sends_each_key_once_across_providers() -> None:
    """The same faults with a fallback provider on every worker (issue 16): the primary's
    outage moves mail to the fallback, and no key is accepted by both providers (an
    ambiguous attempt never fails over before it is reconciled)."""
    config = ChaosConfig.short()
    config.failover = True
    report = run_chaos(config, log=lambda line: print(line, flush=True))
    text = summary(report)
    print(text)
    a = report.audit
    FIGURES["fault harness, failover (short)"] = (
        f"{a.enqueued} deliveries, {report.kills} kills, primary/fallback accepted "
        f"{a.accepted_by_provider}, on both {a.on_both_providers}, lost {a.lost}, duplicates "
        f"{a.duplicates}, unexpected {a.unexpected}, {report.duration_s:.0f}s")
    assert report.settled, text
    assert a.violations == {}, text
    assert a.on_both_providers == 0, text
    assert a.accepted_by_provider["fallback"] > 0, text
    assert a.accepted_by_provider["primary"] > 0, text
    assert a.dead_letters == config.rejects, text
