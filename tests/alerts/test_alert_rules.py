"""The shipped Prometheus rules: valid, unit-tested with ``promtool test rules`` (a firing and
a silent case for every alert), and written only against metrics Postlane exports.

``promtool`` comes with the Debian package ``prometheus`` (``.ci/run`` installs it); without
it these tests fail rather than skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from postlane.callbacks import CallbackSender
from postlane.metrics import FleetSampler, StoreCollector, WorkerMetrics, store_metrics
from postlane.providers.testing import RecordingProvider
from postlane.status import FleetStatus
from postlane.store import open_store
from postlane.store.base import Control, LaneStats, Stats
from postlane.worker import Worker

HERE = Path(__file__).parent
RULES = Path(str(resources.files("postlane").joinpath("alerts", "postlane-rules.yml")))
TESTS = sorted(HERE.glob("*.test.yml"))


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is required (Debian package `prometheus`; `.ci/run` installs "
                    "it): apt-get install -y prometheus", pytrace=False)
    return path


def run(*args: str) -> str:
    result = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                            check=False, cwd=HERE)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text("utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_rules_file_is_valid() -> None:
    assert "SUCCESS" in run("check", "rules", str(RULES))


def test_promtool_unit_tests_pass() -> None:
    assert TESTS, "no tests/alerts/*.test.yml"
    for test_file in TESTS:
        rule_files = yaml.safe_load(test_file.read_text("utf-8"))["rule_files"]
        assert [(test_file.parent / f).resolve() for f in rule_files] == [RULES.resolve()]
    assert "SUCCESS" in run("test", "rules", *(str(t) for t in TESTS))


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, list[bool]] = {}
    for test_file in TESTS:
        for test in yaml.safe_load(test_file.read_text("utf-8"))["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    alerts = [rule["alert"] for rule in rules() if "alert" in rule]
    assert len(alerts) >= 7
    for alert in alerts:
        assert True in cases.get(alert, []), f"{alert}: no test where it fires"
        assert False in cases.get(alert, []), f"{alert}: no test where it stays silent"
    assert all(rule["labels"]["severity"] in ("page", "ticket")
               for rule in rules() if "alert" in rule)


def exported_names() -> set[str]:
    """Every metric family name the two exporters produce (histograms and counters with
    their sample suffixes)."""
    status = FleetStatus(
        Stats(lanes={"interactive": LaneStats(1, 2.0)}, states={"pending": 1},
              attempts={"1": 1}, dead_letters={}, arrivals={"interactive": 1}),
        {"breaker:sandbox": Control("breaker:sandbox", {"state": "open"}, 1, datetime.now(UTC))},
        0.0, 0.0, provider_events={("bounced", "interactive"): 1})
    store = open_store("sqlite:///unused.db")
    collector = StoreCollector(FleetSampler(store))
    collector._status = status  # what render() reads before a scrape
    worker = Worker(store, RecordingProvider(), callbacks=CallbackSender(store))
    names: set[str] = set()
    for text in (generate_latest(collector.registry).decode(),
                 WorkerMetrics(worker).render().decode()):
        names |= {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                  if line and not line.startswith("#")}
    assert {s.name for f in store_metrics(status) for s in f.samples} <= names
    return names


def test_rules_use_only_metrics_postlane_exports() -> None:
    exported = exported_names()
    used = set()
    for rule in rules():
        used |= set(re.findall(r"\b(postlane_[a-z_]+)\b", rule["expr"]))
    assert used, "the rules use no postlane_* metric"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
