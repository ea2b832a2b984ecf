"""The deployment files in ``deploy/`` say only what this Postlane understands.

Nothing here runs a cluster or builds the image; the files are read as data and checked
against the code they drive:

- every Kubernetes document is named (``apiVersion``, ``kind``, ``metadata.name``) and the
  kustomization lists every manifest but the Secret example;
- every ``postlane ...`` a container, a compose service or a systemd unit runs names real
  subcommands and options (the Click tree, as the docs test walks it), the image's
  ``ENTRYPOINT``/``CMD`` taken from the Containerfile;
- probes point at paths the API serves and at ports the container declares; the ports
  agree with what ``serve`` and ``worker --metrics-port`` are told to bind;
- the ConfigMap's ``postlane.toml`` is what ``--config`` accepts: every table a command,
  every key one of its options, every value one the option parses.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer
import yaml

from postlane.api import create_app
from postlane.cli.main import app
from tests.unit.test_docs import check_command, commands_in

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
COMPOSE = DEPLOY / "container" / "compose.yaml"
SECRET_EXAMPLE = KUBE / "secret.example.yaml"
IMAGE = "postlane"  # the image name the manifests use; kustomization.yaml maps it
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def cli() -> Any:
    """The Click command tree (Typer's own vendored Click: duck-typed, as in test_docs)."""
    return typer.main.get_command(app)


# -- reading the files ---------------------------------------------------------------------
def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text("utf-8")) if doc is not None]


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = [(f"{path.name}#{i}", doc) for path in sorted(KUBE.glob("*.yaml"))
             for i, doc in enumerate(documents(path))]
    assert len(found) >= 8, "suspiciously few Kubernetes documents"
    return found


def image_default(instruction: str) -> list[str]:
    """The Containerfile's ``ENTRYPOINT`` or ``CMD`` (exec form)."""
    match = re.search(rf"^{instruction}\s+(\[.*\])\s*$", CONTAINERFILE.read_text("utf-8"),
                      flags=re.M)
    assert match, f"no {instruction} [...] in {CONTAINERFILE.name}"
    value = json.loads(match[1])
    assert isinstance(value, list)
    return [str(v) for v in value]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    kind = doc["kind"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        spec: dict[str, Any] = doc["spec"]["template"]["spec"]
        return spec
    if kind == "CronJob":
        spec = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    return None


def containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(where, container, its pod spec, the document) for every container and init
    container that runs the Postlane image."""
    for where, doc in manifests():
        spec = pod_spec(doc)
        for container in [*(spec or {}).get("initContainers", []),
                          *(spec or {}).get("containers", [])]:
            if container["image"] == IMAGE:
                assert spec is not None
                yield f"{where} {doc['metadata']['name']}/{container['name']}", container, \
                    spec, doc


def kubernetes_argv(container: dict[str, Any]) -> list[str]:
    """What the container runs: ``command`` replaces the image's ENTRYPOINT (and drops its
    CMD), ``args`` replaces CMD."""
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    return [*image_default("ENTRYPOINT"), *container.get("args", image_default("CMD"))]


def compose_argv(service: dict[str, Any]) -> list[str]:
    """Compose's rules: ``entrypoint`` replaces ENTRYPOINT and clears the image's CMD;
    ``command`` replaces CMD. Either may be a string (split like a shell would)."""

    def words(value: str | list[str]) -> list[str]:
        return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]

    if "entrypoint" in service:
        return [*words(service["entrypoint"]), *words(service.get("command", []))]
    return [*image_default("ENTRYPOINT"), *words(service.get("command", image_default("CMD")))]


def systemd_argvs(unit: Path) -> Iterator[list[str]]:
    for line in unit.read_text("utf-8").splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("ExecStart", "ExecStartPre", "ExecStartPost", "ExecStop",
                           "ExecReload"):
            yield shlex.split(value.strip().lstrip("-@:+!"))


def invocations(argv: list[str]) -> list[list[str]]:
    """``postlane ...`` in ``argv``, as the tokens after ``postlane``: run directly, or by
    ``sh -c`` (every ``postlane`` in the script)."""
    if not argv:
        return []
    if PurePosixPath(argv[0]).name == "postlane":
        return [argv[1:]]
    if PurePosixPath(argv[0]).name in ("sh", "bash") and argv[1:2] == ["-c"]:
        return list(commands_in(argv[2]))
    return []


def option_value(tokens: list[str], name: str) -> str | None:
    for i, token in enumerate(tokens):
        if token == name and i + 1 < len(tokens):
            return tokens[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None


def config_toml() -> dict[str, Any]:
    [configmap] = [doc for _, doc in manifests() if doc["kind"] == "ConfigMap"]
    data = tomllib.loads(configmap["data"]["postlane.toml"])
    assert isinstance(data, dict)
    return data


def api_paths() -> set[str]:
    """Every path the HTTP app routes (built, not started: no database is opened)."""
    return {getattr(route, "path", "") for route in create_app("sqlite:///unused.db").routes}


# -- Kubernetes ----------------------------------------------------------------------------
def test_every_document_has_api_version_kind_and_name() -> None:
    problems = [where for where, doc in manifests()
                if not (doc.get("apiVersion") and doc.get("kind")
                        and (doc.get("metadata") or {}).get("name"))]
    assert not problems, f"documents without apiVersion, kind or metadata.name: {problems}"


def test_the_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    [kustomization] = documents(KUBE / "kustomization.yaml")
    listed = kustomization["resources"]
    assert all((KUBE / name).is_file() for name in listed), listed
    expected = sorted(p.name for p in KUBE.glob("*.yaml")
                      if p.name not in ("kustomization.yaml", SECRET_EXAMPLE.name))
    assert sorted(listed) == expected
    assert [image["name"] for image in kustomization["images"]] == [IMAGE]


def test_every_postlane_command_in_the_manifests_exists() -> None:
    root = cli()
    problems, used = [], set()
    for where, container, _, _ in containers():
        found = invocations(kubernetes_argv(container))
        if not found:
            problems.append(f"{where}: runs no postlane command: {kubernetes_argv(container)}")
        for tokens in found:
            used.add(tokens[0])
            if why := check_command(root, tokens):
                problems.append(f"{where}: postlane {' '.join(tokens)}\n    -> {why}")
    assert not problems, "\n".join(problems)
    assert used >= {"migrate", "check", "worker", "serve", "prune"}


def test_probes_point_at_served_paths_and_declared_ports() -> None:
    paths = api_paths()
    assert "/healthz" in paths  # the checker sees real routes
    problems, probed = [], 0
    for where, container, _, _ in containers():
        ports = {p.get("name") for p in container.get("ports", [])} | \
                {p["containerPort"] for p in container.get("ports", [])}
        commands = [tokens[0] for tokens in invocations(kubernetes_argv(container)) if tokens]
        for probe_name in PROBES:
            probe = container.get(probe_name)
            if probe is None:
                continue
            probed += 1
            action = probe.get("httpGet") or probe.get("tcpSocket")
            if action is None or action["port"] not in ports:
                problems.append(f"{where} {probe_name}: port not declared by the container")
            if "httpGet" in probe:
                if commands != ["serve"]:
                    problems.append(f"{where} {probe_name}: HTTP probe on a non-API container")
                elif probe["httpGet"]["path"] not in paths:
                    problems.append(f"{where} {probe_name}: the API serves no "
                                    f"{probe['httpGet']['path']}")
    assert not problems, "\n".join(problems)
    assert probed >= 3


def test_ports_agree_with_what_the_processes_bind() -> None:
    serve_port = config_toml()["serve"]["port"]
    services = [doc for _, doc in manifests() if doc["kind"] == "Service"]
    checked = set()
    for where, container, _, doc in containers():
        tokens = invocations(kubernetes_argv(container))[0]
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if tokens[0] == "serve":
            assert ports == {"http": serve_port}, where
            labels = doc["spec"]["template"]["metadata"]["labels"]
            [service] = [s for s in services
                         if s["spec"]["selector"].items() <= labels.items()]
            assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
            checked.add("serve")
        if tokens[0] == "worker":
            # Scrapers reach the worker's metrics: bound to every address of the pod, on
            # the declared port, which the scrape annotations name.
            port = option_value(tokens, "--metrics-port")
            assert port is not None and ports == {"metrics": int(port)}, where
            assert option_value(tokens, "--metrics-addr") == "0.0.0.0", where
            annotations = doc["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/scrape"] == "true"
            assert annotations["prometheus.io/port"] == port
            checked.add("worker")
    assert checked == {"serve", "worker"}


def test_the_config_map_is_what_postlane_config_accepts() -> None:
    root = cli()
    settings = config_toml()
    assert set(settings) >= {"worker", "serve"}
    for table, values in settings.items():
        assert isinstance(values, dict) and table in root.commands, f"[{table}]"
        command = root.commands[table]
        names = {p.name for p in command.params if p.param_type_name == "option"}
        unknown = {key for key in values if key.replace("-", "_") not in names}
        assert not unknown, f"[{table}] keys no option reads: {sorted(unknown)}"
        # Parse as `postlane --config` would: each value through its option's type.
        context = command.make_context(
            table, [], default_map={k.replace("-", "_"): v for k, v in values.items()})
        assert context.params  # a bad value would have raised BadParameter


def test_pods_read_the_config_map_and_the_secrets_they_name() -> None:
    secrets = {doc["metadata"]["name"]: doc for doc in documents(SECRET_EXAMPLE)}
    assert all(doc["kind"] == "Secret" for doc in secrets.values())
    for where, container, spec, _ in containers():
        for source in container.get("envFrom", []):
            assert source["secretRef"]["name"] in secrets, where
        env = {item["name"]: item.get("value") for item in container.get("env", [])}
        if "POSTLANE_CONFIG" not in env:
            continue
        path = PurePosixPath(env["POSTLANE_CONFIG"])
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        volume = volumes[mounts[str(path.parent)]]
        assert volume["configMap"]["name"] == "postlane-config", where
        assert path.name == "postlane.toml", where
    # The API sends nothing: it gets the database, not the provider's credentials.
    for where, container, _, _ in containers():
        if invocations(kubernetes_argv(container))[0][0] == "serve":
            names = [s["secretRef"]["name"] for s in container["envFrom"]]
            assert names == ["postlane-db"], where


def test_the_image_user_is_numeric_for_run_as_non_root() -> None:
    user = re.findall(r"^USER\s+(\S+)", CONTAINERFILE.read_text("utf-8"), flags=re.M)
    assert user and re.fullmatch(r"[1-9]\d*(:\d+)?", user[-1]), user


def test_the_image_installs_the_extras_the_deployments_use() -> None:
    """A plain ``pip install .`` has no PostgreSQL driver, Redis client or HTTP server."""
    installs = re.findall(r"pip install '?\.\[([a-z0-9,]+)\]'?", CONTAINERFILE.read_text("utf-8"))
    assert len(installs) == 1, "the Containerfile installs no extras"
    extras = set(installs[0].split(","))
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "optional-dependencies"]
    assert extras <= set(declared), sorted(extras - set(declared))
    provider = config_toml()["worker"]["provider"].split(":", 1)[0]
    assert extras >= {"postgres", "redis", "server", provider}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders_the_directory() -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    result = subprocess.run([kubectl, "kustomize", str(KUBE)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    listed = [doc for _, doc in manifests() if doc["kind"] not in ("Kustomization", "Secret")]
    assert len(rendered) == len(listed)
    assert all(doc["metadata"].get("namespace") == "postlane" for doc in rendered
               if doc["kind"] != "Namespace")


# -- compose and systemd -------------------------------------------------------------------
def test_every_postlane_command_in_compose_exists() -> None:
    root = cli()
    services = yaml.safe_load(COMPOSE.read_text("utf-8"))["services"]
    ours = {name: s for name, s in services.items()
            if "build" in s or str(s.get("image", "")).startswith(IMAGE)}
    assert set(ours) >= {"migrate", "worker", "api"}
    problems = []
    for name, service in ours.items():
        found = invocations(compose_argv(service))
        if not found:
            problems.append(f"{name}: runs no postlane command")
        problems += [f"{name}: postlane {' '.join(tokens)} -> {why}"
                     for tokens in found if (why := check_command(root, tokens))]
    assert not problems, "\n".join(problems)


def test_every_postlane_command_in_the_systemd_units_exists() -> None:
    root = cli()
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert len(units) >= 3
    problems = []
    for unit in units:
        found = [tokens for argv in systemd_argvs(unit) for tokens in invocations(argv)]
        if not found:
            problems.append(f"{unit.name}: runs no postlane command")
        problems += [f"{unit.name}: postlane {' '.join(tokens)} -> {why}"
                     for tokens in found if (why := check_command(root, tokens))]
    assert not problems, "\n".join(problems)


def test_the_checks_catch_mistakes() -> None:
    root = cli()
    assert invocations(["/opt/postlane/venv/bin/postlane", "worker"]) == [["worker"]]
    assert invocations(["sh", "-c", "postlane check && exec postlane worker"]) == [
        ["check"], ["worker"]]
    assert invocations(["redis-server", "--save", ""]) == []
    assert "no option --metrics-host" in (
        check_command(root, ["worker", "--metrics-host", "0.0.0.0"]) or "")
    assert "no subcommand 'purge'" in (check_command(root, ["purge", "--older-than", "7d"]) or "")
    assert compose_argv({"command": ["migrate"]}) == [*image_default("ENTRYPOINT"), "migrate"]
    assert kubernetes_argv({"command": ["sh"]}) == ["sh"]  # command drops the image's CMD
    with pytest.raises(typer.BadParameter):
        root.commands["worker"].make_context(
            "worker", [], default_map={"provider": "noop://", "lease": "thirty seconds"})
