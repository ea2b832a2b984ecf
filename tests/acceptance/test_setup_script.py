"""scripts/setup-test-services, the README test command's first step, on machines it cannot
be tried on for real in CI: a fresh one (nothing installed), one with PostgreSQL down, one
whose PostgreSQL refuses the test role. Every system command it calls is a stub on PATH
that records its call; "installing" a Debian package puts that package's stubs on PATH. Run
twice, it must do nothing the second time."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup-test-services"
REAL_TOOLS = ("seq", "sleep", "ls", "sort", "tail", "tee", "env", "cat", "grep", "touch",
              "ln")

STUBS = {
    "id": 'echo 0',
    "mkdir": 'echo "mkdir $*" >> "$STATE/log"',
    "pg_isready": '[ -e "$STATE/pg_up" ]',
    "pg_ctlcluster": '''echo "pg_ctlcluster $*" >> "$STATE/log"
case "$*" in
  *start*) touch "$STATE/pg_up" ;;
  *reload*) if grep -q trust "$PG_ETC"/*/main/pg_hba.conf; then touch "$STATE/pg_trust"; fi ;;
esac''',
    "psql": '[ -e "$STATE/pg_up" ] && [ -e "$STATE/pg_trust" ]',
    "redis-cli": '[ -e "$STATE/redis_up" ]',
    "redis-server": 'echo "redis-server" >> "$STATE/log"; touch "$STATE/redis_up"',
    "smtp-sink": "true",
    "promtool": "true",
    "chromium": "true",
    "apt-get": '''echo "apt-get $*" >> "$STATE/log"
[ "$1" = install ] || exit 0
for package in "$@"; do
  case "$package" in
    postgresql-client) commands="psql" ;;
    postgresql) commands="psql pg_isready pg_ctlcluster"
      /bin/mkdir -p "$PG_ETC/16/main"
      echo "host all all 127.0.0.1/32 scram-sha-256" > "$PG_ETC/16/main/pg_hba.conf" ;;
    redis-server) commands="redis-server redis-cli" ;;
    postfix) commands="smtp-sink" ;;
    prometheus) commands="promtool" ;;
    chromium) commands="chromium" ;;
    *) commands="" ;;
  esac
  for command in $commands; do ln -sf "$CATALOG/$command" "$BIN/$command"; done
done''',
}
ALWAYS_THERE = ("id", "mkdir", "apt-get")


class Machine:
    def __init__(self, tmp_path: Path) -> None:
        self.state = tmp_path / "state"
        self.catalog = tmp_path / "catalog"
        self.bin = tmp_path / "bin"
        self.pg_etc = tmp_path / "etc-postgresql"
        for folder in (self.state, self.catalog, self.bin):
            folder.mkdir()
        for name, body in STUBS.items():
            stub = self.catalog / name
            stub.write_text(f"#!/bin/bash\n{body}\n")
            stub.chmod(0o755)
        for name in REAL_TOOLS:
            found = shutil.which(name)
            assert found, name
            (self.bin / name).symlink_to(found)
        self.install(*ALWAYS_THERE)

    def install(self, *commands: str) -> None:
        for command in commands:
            (self.bin / command).symlink_to(self.catalog / command)

    def has_postgres(self, *, trust: bool) -> None:
        self.install("psql", "pg_isready", "pg_ctlcluster")
        main = self.pg_etc / "16" / "main"
        main.mkdir(parents=True)
        (main / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\n")
        if trust:
            (self.state / "pg_trust").touch()

    def run(self, **extra_env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        log = self.state / "log"
        log.write_text("")
        env = {"PATH": str(self.bin), "STATE": str(self.state), "CATALOG": str(self.catalog),
               "BIN": str(self.bin), "PG_ETC": str(self.pg_etc),
               "POSTLANE_PG_ETC": str(self.pg_etc), **extra_env}
        done = subprocess.run(["/bin/bash", str(SCRIPT)], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        return done, log.read_text().splitlines()


# Postfix's smtp-sink is looked for in /usr/sbin too (not on every user's PATH).
POSTFIX = [] if os.path.exists("/usr/sbin/smtp-sink") else ["postfix"]


def test_a_fresh_machine_gets_everything_installed_and_started_then_nothing_twice(
        tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    first, calls = machine.run()
    assert first.returncode == 0, first.stdout + first.stderr
    prefix = "apt-get install -y -qq --no-install-recommends "
    installs = [call.removeprefix(prefix) for call in calls if call.startswith(prefix)]
    assert installs == ["postgresql-client", "postgresql", "redis-server",
                        " ".join([*POSTFIX, "prometheus", "chromium"])]
    assert sum(call == "apt-get update -qq" for call in calls) == 1
    assert "pg_ctlcluster --skip-systemctl-redirect 16 main start" in calls
    assert "pg_ctlcluster --skip-systemctl-redirect 16 main reload" in calls
    hba = (machine.pg_etc / "16" / "main" / "pg_hba.conf").read_text()
    assert hba == "local all all trust\nhost all all 127.0.0.1/32 trust\n"
    assert "redis-server" in calls

    second, calls = machine.run()
    assert second.returncode == 0, second.stdout + second.stderr
    assert calls == []
    assert second.stdout.strip().startswith("== test services ready")


def test_postgres_and_redis_down_are_started_and_nothing_installed(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    machine.has_postgres(trust=True)
    machine.install("redis-server", "redis-cli", "smtp-sink", "promtool", "chromium")
    done, calls = machine.run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls == ["pg_ctlcluster --skip-systemctl-redirect 16 main start",
                     "mkdir -p /var/lib/redis /var/log/redis", "redis-server"]


def test_a_postgres_it_did_not_install_is_not_reconfigured(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    machine.has_postgres(trust=False)
    (machine.state / "pg_up").touch()
    done, calls = machine.run()
    assert done.returncode == 1
    assert "refuses role postgres without a password" in done.stderr
    assert not any(call.startswith(("apt-get", "pg_ctlcluster")) for call in calls)


def test_installing_can_be_refused(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    machine.has_postgres(trust=True)
    (machine.state / "pg_up").touch()
    (machine.state / "redis_up").touch()
    machine.install("redis-cli")
    done, calls = machine.run(POSTLANE_CI_SKIP_APT="1")
    assert done.returncode == 0  # only the tests that use the tools fail, each saying why
    assert "missing Debian packages" in done.stderr and "POSTLANE_CI_SKIP_APT=1" in done.stderr
    assert "not installed: " in done.stdout
    assert calls == []
