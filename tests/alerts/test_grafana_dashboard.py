"""The shipped Grafana dashboard (``postlane/grafana/postlane.json``) charts only what
Postlane exports: every metric name in every PromQL expression is one the two exporters
render, every expression parses (``promtool check rules`` on a rule file wrapping them,
when promtool is installed), and the file ships in the package.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from postlane.cli.main import app
from tests.alerts.test_alert_rules import exported_names
from tests.unit.test_docs import check_command, commands_in

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = Path(str(resources.files("postlane").joinpath("grafana", "postlane.json")))

# Grafana's interval macros, as a fixed window for promtool.
_MACROS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset",
                "bool", "and", "or", "unless", "inf", "nan"}


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text("utf-8"))
    assert isinstance(data, dict)
    return data


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those folded into collapsed rows."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query target of every panel."""
    return [(panel["title"], target["expr"]) for panel in panels(dashboard()["panels"])
            for target in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings, label
    matchers, ranges, grouping label lists and offsets are removed, that are neither
    functions (followed by "(") nor keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        if match[2] is None and match[1].lower() not in _NOT_METRICS:
            names.add(match[1])
    return names


def test_the_metric_name_extractor() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, lane) '
                        '(rate(postlane_send_duration_seconds_bucket{lane=~"a|b"}'
                        '[$__rate_interval])))') == {"postlane_send_duration_seconds_bucket"}
    assert metric_names("sum(rate(a_total[5m])) / on (x) group_left (y) b offset 1h > bool 0 "
                        "or vector(1e3)") == {"a_total", "b"}
    assert metric_names("max by (lane) (postlane_queue_dept)") == {"postlane_queue_dept"}


def test_every_metric_in_the_dashboard_is_exported() -> None:
    found = expressions()
    assert len(found) >= 12
    used = {name for _, expr in found for name in metric_names(expr)}
    unknown = sorted(used - exported_names())
    assert not unknown, f"the dashboard queries metrics postlane does not export: {unknown}"
    # The panels issue 15 asks for: depth and oldest age per lane, sends by outcome,
    # dead-letter arrivals by reason, limiter waits, breaker state, attempt duration.
    assert used >= {"postlane_queue_depth", "postlane_queue_oldest_age_seconds",
                    "postlane_sends_total", "postlane_dead_letter_arrivals_total",
                    "postlane_limiter_waits_total", "postlane_breaker_state",
                    "postlane_send_duration_seconds_bucket"}


def test_panels_are_well_formed() -> None:
    data = dashboard()
    assert data["uid"] == "postlane" and data["title"]
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in panels(data["panels"])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(data["panels"]):
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["refId"], panel["title"]


def test_commands_in_panel_descriptions_exist() -> None:
    root = typer.main.get_command(app)
    problems = [f"{panel['title']}: postlane {' '.join(tokens)}: {why}"
                for panel in panels(dashboard()["panels"])
                for tokens in commands_in(panel.get("description", ""))
                if (why := check_command(root, tokens))]
    assert not problems, "\n".join(problems)


def test_the_dashboard_ships_in_the_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["postlane"]
    relative = DASHBOARD.relative_to(ROOT / "src" / "postlane").as_posix()
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), patterns


def test_every_expression_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`)")
    rules = []
    for i, (_, expr) in enumerate(expressions()):
        for macro, value in _MACROS.items():
            expr = expr.replace(macro, value)
        assert "$" not in expr, f"an unknown Grafana variable in {expr}"
        rules.append({"record": f"dashboard:panel_{i}", "expr": expr})
    rule_file = tmp_path / "dashboard-rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}),
                         "utf-8")
    result = subprocess.run([promtool, "check", "rules", str(rule_file)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
