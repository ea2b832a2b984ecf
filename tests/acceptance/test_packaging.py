"""What users install is what CI tests: the sdist builds, a wheel builds from it, and that
wheel alone, in a new virtualenv, runs ``postlane demo`` (the README's first command) with
no optional package installed. Needs PyPI (or pip's cache) for the build backend and the
core dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("postlane/store/sql/sqlite/0001_", "postlane/store/sql/postgres/0001_",
           "postlane/dashboard/templates/", "postlane/dashboard/static/",
           "postlane/alerts/", "postlane/grafana/postlane.json", "postlane/py.typed")


def _run(*args: str | Path, cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.packaging
def test_the_wheel_built_from_the_sdist_runs_the_demo_in_a_new_virtualenv(
        tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # Without --sdist/--wheel, build makes the sdist and then the wheel from it: a file
    # missing from the sdist is missing from the wheel too.
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    (sdist,) = dist.glob("postlane-*.tar.gz")
    (wheel,) = dist.glob("postlane-*.whl")
    with tarfile.open(sdist) as archive:
        in_sdist = archive.getnames()
    in_wheel = zipfile.ZipFile(wheel).namelist()
    for part in SHIPPED:
        assert any(part in name for name in in_sdist), f"{part} not in the sdist"
        assert any(name.startswith(part) for name in in_wheel), f"{part} not in the wheel"

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    _run(venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel,
         cwd=tmp_path)
    optional = ("psycopg", "psycopg_pool", "redis", "aiosmtplib", "boto3", "fastapi",
                "uvicorn", "cryptography", "sqlalchemy")
    present = _run(venv / "bin" / "python", "-c",
                   f"import importlib.util; print([m for m in {optional!r} "
                   "if importlib.util.find_spec(m)])", cwd=tmp_path)
    assert json.loads(present.replace("'", '"')) == []

    out = _run(venv / "bin" / "postlane", "demo", "--bulk", "200", "--interactive", "4",
               "--json", cwd=tmp_path, timeout=180)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ok"] is True
    # 200 digests, 4 interactive emails, and the SMS fallback of the refused reset (reset:1).
    assert [f["email_key"] for f in summary["sms_fallbacks"]] == ["reset:1"]
    assert summary["sent"] + summary["dead_letters"] == 204 + 1
