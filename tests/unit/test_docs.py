"""The documentation is built and kept honest against the code.

- ``mkdocs build --strict`` succeeds: a broken link or anchor, or a page left out of the nav,
  fails it (mkdocs.yml turns those into warnings, and --strict makes warnings fatal).
- The generated parts are current: the option tables of docs/configuration.md and the
  command reference of docs/cli.md (scripts/gen_cli_docs.py), docs/openapi.json and the
  endpoint reference of docs/http-api.md (scripts/export_openapi.py).
- Every ``postlane ...`` command quoted in the docs (code blocks and inline code), in the
  README and in the alert rules' annotations exists: its subcommand path is walked in the
  Click command tree and every ``--option`` is a real option of that command.
- Every metric, recording rule and alert name quoted in docs/metrics.md and the runbook
  exists, and docs/metrics.md covers every one of them.
- The read-only SQL the runbook offers (where Postlane has no command) runs on PostgreSQL.
- The getting-started examples run as written: on SQLite (sqlite3, SQLAlchemy, a template,
  then a worker that sends them) and on PostgreSQL (psycopg, async psycopg, SQLAlchemy).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
import typer
import yaml

from postlane.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNBOOK = DOCS / "runbook"
METRICS_SOURCE = ROOT / "src" / "postlane" / "metrics.py"
RULES_FILE = ROOT / "src" / "postlane" / "alerts" / "postlane-rules.yml"

# Code blocks in these languages hold commands (or their output); others hold code.
SHELL_LANGUAGES = {"", "sh", "bash", "shell", "console", "text"}
RUNBOOK_SECTIONS = ("What you see", "The alert", "Cause", "Diagnose", "Fix")


def load_script(name: str) -> ModuleType:
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


# -- Markdown: code blocks and inline code -------------------------------------------------
@dataclass(frozen=True)
class Quote:
    """A piece of quoted text: a fenced block (with its language) or an inline code span."""

    where: str
    text: str
    language: str | None  # None: inline code


_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")


def quotes(path: Path) -> Iterator[Quote]:
    """Fenced code blocks and inline code spans of a Markdown file, with line numbers."""
    lines = path.read_text(encoding="utf-8").split("\n")
    name = path.relative_to(ROOT)
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, start = match["fence"], i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        language = match["info"].strip().split(" ")[0].lower()
        yield Quote(f"{name}:{start + 1}", "\n".join(body), language)
    # Inline code, paragraph by paragraph (a span may wrap across lines).
    paragraph: list[tuple[int, str]] = []
    for number, line in [*prose, (0, "")]:
        if line.strip():
            paragraph.append((number, line))
            continue
        if paragraph:
            text = " ".join(line for _, line in paragraph)
            for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
                yield Quote(f"{name}:{paragraph[0][0]}", span.group(1), None)
            paragraph = []


# -- commands ------------------------------------------------------------------------------
_COMMAND_START = re.compile(r"(?:^|(?<=[\s;&|(`'\"/]))postlane[ \t]+(?=\S)")
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}


def commands_in(text: str) -> Iterator[list[str]]:
    """Every ``postlane ...`` invocation in ``text``, as tokens after ``postlane``."""
    text = text.replace("\\\n", " ")
    for line in text.split("\n"):
        line = re.sub(r"^\s*\$\s+", "", line)
        for match in _COMMAND_START.finditer(line):
            lexer = shlex.shlex(line[match.end():], posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError as exc:  # unbalanced quotes
                yield ["<unparsable>", str(exc), line]
                continue
            command: list[str] = []
            for token in tokens:
                if token in _SEPARATORS:
                    break
                command.append(token)
            yield command


def _options(command: Any) -> dict[str, Any]:
    found = {"--help": None}
    for param in command.params:
        if param.param_type_name == "option":
            for name in (*param.opts, *param.secondary_opts):
                found[name] = param
    return found


def check_command(root: Any, tokens: list[str]) -> str | None:
    """None if ``postlane <tokens>`` names a real command with real options, else why not."""
    if tokens and tokens[0] == "<unparsable>":
        return f"cannot parse: {tokens[1]}"
    command, path = root, ["postlane"]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("-") and token != "-":
            name = token.split("=", 1)[0]
            options = _options(command)
            if name not in options:
                return (f"`{' '.join(path)}` has no option {name} "
                        f"(it has: {', '.join(sorted(options))})")
            param = options[name]
            takes_value = param is not None and not getattr(param, "is_flag", False)
            i += 2 if takes_value and "=" not in token else 1
            continue
        if hasattr(command, "commands"):
            if token not in command.commands:
                return (f"`{' '.join(path)}` has no subcommand {token!r} "
                        f"(it has: {', '.join(command.commands)})")
            command = command.commands[token]
            path.append(token)
        i += 1  # a positional argument of a command: not checked
    return None


def quoted_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in [*doc_pages(), ROOT / "README.md"]:
        for quote in quotes(path):
            if quote.language is not None and quote.language not in SHELL_LANGUAGES:
                continue
            found += [(quote.where, tokens) for tokens in commands_in(quote.text)]
    return found


def test_every_quoted_command_exists() -> None:
    root = typer.main.get_command(app)
    found = quoted_commands()
    assert len(found) > 100, "the command scan found suspiciously few commands"
    problems = [f"{where}: postlane {' '.join(tokens)}\n    -> {why}"
                for where, tokens in found if (why := check_command(root, tokens))]
    assert not problems, "commands quoted in the docs that the CLI does not have:\n" + \
        "\n".join(problems)


def test_commands_in_alert_annotations_exist() -> None:
    root = typer.main.get_command(app)
    rules = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    problems = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            for text in (rule.get("annotations") or {}).values():
                for tokens in commands_in(text):
                    if why := check_command(root, tokens):
                        problems.append(f"{rule.get('alert')}: postlane {' '.join(tokens)}: {why}")
    assert not problems, "\n".join(problems)


def test_the_command_checker_catches_mistakes() -> None:
    root = typer.main.get_command(app)
    assert check_command(root, ["dlq", "replay", "41", "--reason", "permanent"]) is None
    assert check_command(root, ["--db", "sqlite:///x.db", "worker", "--drain"]) is None
    assert check_command(root, ["worker", "--no-drain", "--rate=200/s"]) is None
    assert "no subcommand 'requeue'" in (check_command(root, ["dlq", "requeue", "4"]) or "")
    assert "no option --force" in (check_command(root, ["dlq", "replay", "--force"]) or "")
    assert "no subcommand" in (check_command(root, ["breaker", "close"]) or "")
    assert list(commands_in("$ postlane pause bulk && postlane resume bulk  # later")) == [
        ["pause", "bulk"], ["resume", "bulk"]]
    assert list(commands_in("from postlane import Message; postlane.enqueue(conn)")) == [
        ["import", "Message"]]  # why python blocks are not scanned


# -- generated pages -----------------------------------------------------------------------
def test_cli_and_configuration_pages_are_generated_from_the_cli() -> None:
    generator = load_script("gen_cli_docs")
    stale = [path.name for path, text in generator.expected_pages().items()
             if path.read_text(encoding="utf-8") != text]
    assert not stale, f"{stale} out of date with the CLI: run python scripts/gen_cli_docs.py"


def _sections(page: Path) -> dict[str, str]:
    """``### postlane ...`` heading -> the text under it."""
    parts = re.split(r"^#{2,4} (postlane(?: [a-z-]+)*)\s*$", page.read_text(encoding="utf-8"),
                     flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_every_option_is_on_the_configuration_page() -> None:
    generator = load_script("gen_cli_docs")
    sections = _sections(DOCS / "configuration.md")
    missing = []
    for cmd in generator.commands():
        for param in cmd.options:
            section = sections.get(cmd.name, "")
            for name in param.opts:
                if f"`{name}`" not in section:
                    missing.append(f"{cmd.name} {name}")
            envvar = getattr(param, "envvar", None)
            if isinstance(envvar, str) and f"`{envvar}`" not in section:
                missing.append(f"{cmd.name} {param.opts[0]}: {envvar}")
    assert not missing, ("options missing from docs/configuration.md (run python "
                         "scripts/gen_cli_docs.py): " + ", ".join(missing))


def test_every_environment_variable_is_on_the_configuration_page() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    source = "\n".join(p.read_text(encoding="utf-8")
                       for p in (ROOT / "src" / "postlane").rglob("*.py"))
    names = set(re.findall(r"\bPOSTLANE_[A-Z0-9_]*[A-Z0-9]\b", source))
    missing = sorted(n for n in names if f"`{n}`" not in page and n + "`" not in page)
    assert not missing, f"environment variables not on docs/configuration.md: {missing}"


def test_configuration_example_keys_are_real_options() -> None:
    import tomllib

    root = typer.main.get_command(app)
    blocks = [q for q in quotes(DOCS / "configuration.md") if q.language == "toml"]
    assert blocks
    problems = []
    for block in blocks:
        data = tomllib.loads(block.text)

        def walk(command: Any, table: dict[str, Any], path: list[str]) -> None:
            names = {p.name for p in command.params if p.param_type_name == "option"}
            subcommands = getattr(command, "commands", {})
            for key, value in table.items():
                if not path and key == "db":
                    continue
                if isinstance(value, dict) and (key in subcommands):
                    walk(subcommands[key], value, [*path, key])
                elif path and (key.replace("-", "_") in names):
                    continue
                else:
                    problems.append(f"[{'.'.join(path) or 'top level'}] {key}")

        walk(root, data, [])
    assert not problems, f"keys in docs/configuration.md's example that no command reads: " \
                         f"{problems}"


def test_openapi_export_and_api_page_are_current() -> None:
    exporter = load_script("export_openapi")
    stale = [path.name for path, text in exporter.expected_files().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"{stale} out of date with the API: run python scripts/export_openapi.py"


# -- metrics and alerts --------------------------------------------------------------------
def defined_metrics() -> set[str]:
    return set(re.findall(r"\"(postlane_[a-z0-9_]+)\"", METRICS_SOURCE.read_text("utf-8")))


def defined_rules() -> tuple[set[str], set[str]]:
    rules = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    alerts, records = set(), set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                alerts.add(rule["alert"])
            if "record" in rule:
                records.add(rule["record"])
    return alerts, records


def metric_known(name: str, metrics: set[str]) -> bool:
    """An exposed series name: a defined name, or one with a suffix Prometheus adds."""
    if name in metrics:
        return True
    for suffix in ("_total", "_bucket", "_sum", "_count", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in metrics:
            return True
        if name.endswith(suffix) and name in {m + suffix for m in metrics}:
            return True
    return f"{name}_total" in metrics


def quoted_names(paths: list[Path]) -> list[tuple[str, str]]:
    found = []
    for path in paths:
        for quote in quotes(path):
            if quote.language == "sql":
                continue
            for name in re.findall(r"\bpostlane_[a-z0-9_]*[a-z0-9]\b|\bpostlane:[a-z0-9_:]+\b"
                                   r"|\bPostlane[A-Z][A-Za-z]+\b", quote.text):
                found.append((quote.where, name))
    return found


def test_metric_and_alert_names_in_the_docs_exist() -> None:
    metrics = defined_metrics()
    alerts, records = defined_rules()
    assert len(metrics) >= 10 and len(alerts) >= 5
    pages = [DOCS / "metrics.md", *sorted(RUNBOOK.glob("*.md"))]
    found = quoted_names(pages)
    assert len(found) > 50
    unknown = [f"{where}: {name}" for where, name in found
               if not (name in alerts or name in records or metric_known(name, metrics))]
    assert not unknown, "metric or alert names that do not exist:\n" + "\n".join(unknown)


def test_the_metrics_page_covers_every_metric_and_rule() -> None:
    metrics = defined_metrics()
    alerts, records = defined_rules()
    quoted = {name for _, name in quoted_names([DOCS / "metrics.md"])}
    missing = [m for m in sorted(metrics)
               if not any(q == m or q.startswith(m + "_") for q in quoted)]
    missing += sorted((alerts | records) - quoted)
    assert not missing, f"not on docs/metrics.md: {missing}"


# -- the runbook ---------------------------------------------------------------------------
def test_each_runbook_page_has_its_parts_and_is_listed() -> None:
    index = (RUNBOOK / "index.md").read_text(encoding="utf-8")
    pages = sorted(p for p in RUNBOOK.glob("*.md") if p.name != "index.md")
    assert len(pages) >= 10
    problems = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        headings = re.findall(r"^## (.+)$", text, flags=re.M)
        for section in RUNBOOK_SECTIONS:
            if not any(h.startswith(section) for h in headings):
                problems.append(f"{page.name}: no '## {section}' section")
        if f"({page.name})" not in index:
            problems.append(f"{page.name}: not linked from runbook/index.md")
        if not re.search(r"`postlane [a-z]", text):
            problems.append(f"{page.name}: quotes no postlane command")
    assert not problems, "\n".join(problems)


def test_sql_in_the_docs_runs_on_postgresql(fresh_pg_url: str) -> None:
    """The read-only queries the runbook offers where Postlane has no command."""
    from typer.testing import CliRunner

    assert CliRunner().invoke(app, ["--db", fresh_pg_url, "migrate"]).exit_code == 0
    blocks = [q for page in doc_pages() for q in quotes(page) if q.language == "sql"]
    assert blocks
    with psycopg.connect(fresh_pg_url) as conn:
        for block in blocks:
            try:
                conn.execute(block.text.encode())
            except psycopg.Error as exc:
                pytest.fail(f"{block.where}: {exc}")
            finally:
                conn.rollback()


# -- the site ------------------------------------------------------------------------------
def test_no_fenced_code_inside_lists() -> None:
    """Python-Markdown's fenced code works only at the top level: an indented fence (in a
    list item or an admonition) renders as inline code, silently."""
    indented = [f"{page.relative_to(ROOT)}:{number}"
                for page in doc_pages()
                for number, line in enumerate(page.read_text("utf-8").split("\n"), 1)
                if re.match(r"^ +(```|~~~)", line)]
    assert not indented, f"fenced code indented (it would render as inline code): {indented}"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    built = {p.relative_to(tmp_path / "site").with_suffix(".md").as_posix()
             for p in (tmp_path / "site").rglob("*.html")}
    pages = {p.relative_to(DOCS).as_posix() for p in doc_pages()}
    assert pages <= built, f"pages not built: {sorted(pages - built)}"
    assert (tmp_path / "site" / "openapi.json").exists()


# -- the getting-started examples ----------------------------------------------------------
GETTING_STARTED = DOCS / "getting-started.md"


def example(name: str) -> str:
    """The code block right after ``<!-- example: NAME -->`` in getting-started.md."""
    text = GETTING_STARTED.read_text(encoding="utf-8")
    match = re.search(rf"<!-- example: {re.escape(name)} -->\s*\n```[a-z]*\n(.*?)\n```",
                      text, flags=re.S)
    assert match, f"no example {name!r} in docs/getting-started.md"
    return match.group(1)


def run_python(name: str, replacements: dict[str, str] | None = None) -> None:
    source = example(name)
    for old, new in (replacements or {}).items():
        assert old in source, f"example {name!r} no longer contains {old!r}"
        source = source.replace(old, new)
    code = compile(source, f"getting-started.md:{name}", "exec", dont_inherit=True)
    exec(code, {"__name__": "__main__"})


def run_shell(name: str, replacements: dict[str, str] | None = None) -> list[str]:
    """Run the example's ``postlane`` lines, in this process (the CLI's own entry point)."""
    from typer.testing import CliRunner

    runner = CliRunner()
    outputs = []
    for line in example(name).splitlines():
        for old, new in (replacements or {}).items():
            line = line.replace(old, new)
        argv = shlex.split(line)
        assert argv[0] == "postlane", line
        result = runner.invoke(app, argv[1:], env={"POSTLANE_DATABASE_URL": None,
                                                   "POSTLANE_CONFIG": None,
                                                   "COLUMNS": "200"})
        assert result.exit_code == 0, f"{line}\n{result.output}\n{result.exception!r}"
        outputs.append(result.output)
    return outputs


def test_getting_started_on_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_shell("setup")
    run_python("sqlite3")
    run_python("sqlalchemy", {"postgresql+psycopg://localhost/app": "sqlite:///app.db"})
    run_shell("setup-template")
    run_python("template")
    with sqlite3.connect(tmp_path / "app.db") as conn:
        users = [r[0] for r in conn.execute("SELECT email FROM users ORDER BY id")]
        rows = conn.execute("SELECT idempotency_key, state, subject FROM postlane_delivery_rows "
                            "ORDER BY id").fetchall()
    conn.close()
    # Bob's signup rolled back with his welcome message; the repeat of welcome:1 wrote nothing.
    assert users == ["ada@example.com", "ada@example.com", "grace@example.com"]
    assert rows == [("welcome:1", "pending", "Welcome"), ("welcome:2", "pending", "Welcome"),
                    ("welcome:3", "pending", "Welcome, Grace")]

    _, status, timeline = run_shell("send")
    assert "sent=3" in status.replace(" ", "")
    assert "key=welcome:1" in timeline and "state=sent" in timeline


def test_getting_started_on_postgresql(fresh_pg_url: str, tmp_path: Path) -> None:
    run_shell("setup", {"sqlite:///app.db": fresh_pg_url})
    plain = {"postgresql://localhost/app": fresh_pg_url}
    run_python("psycopg", plain)
    run_python("psycopg-async", plain)
    run_python("sqlalchemy", {"postgresql+psycopg://localhost/app":
                              fresh_pg_url.replace("postgresql://", "postgresql+psycopg://", 1)})
    with psycopg.connect(fresh_pg_url) as conn:
        rows = conn.execute("SELECT idempotency_key, state, lane FROM postlane_delivery_rows "
                            "ORDER BY id").fetchall()
    assert rows == [("welcome:1", "pending", "bulk"), ("welcome:2", "pending", "bulk"),
                    ("welcome:3", "pending", "bulk")]
