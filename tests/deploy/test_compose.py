"""The deployment in docker/ matches the code: every command the compose file and the
Dockerfiles run exists (console scripts, manage.py commands, the Celery app and its queues,
module paths, ASGI application), the agent image pins what the `agent` extra pins, the example
environment names only settings the code reads, and docs/deploy.md covers every service.

No Docker engine is needed: the files are parsed, the commands resolved against the code.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
THIRD_PARTY = {"postgres", "redis"}  # their own images and commands


def _module_file(dotted: str) -> Path | None:
    spec = importlib.util.find_spec(dotted)
    return Path(spec.origin) if spec and spec.origin else None


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
    return False


def _management_commands() -> set[str]:
    from django.core.management import get_commands

    return set(get_commands())


def _queues() -> set[str]:
    from controlplane.celery import Queue

    return {q.value for q in Queue}


def check_command(argv: list[str]) -> None:
    """Raise AssertionError unless ``argv`` runs something that exists in this repository."""
    assert argv, "empty command"
    prog, args = argv[0], argv[1:]
    scripts = PYPROJECT["project"]["scripts"]
    if prog == "daphne":
        target = next(a for a in args if ":" in a and not a.startswith("-"))
        module, attr = target.split(":")
        path = _module_file(module)
        assert path and _defines(path, attr), f"daphne target {target} does not exist"
        # The agents' socket carries messages up to the protocol's limit (a warm-up job holds its
        # prefix's token ids): daphne's own default (1 MiB) would refuse the larger ones.
        from wire.protocol import SOCKET_MESSAGE_MAX_BYTES

        assert "--websocket-max-message-size" in args, "daphne without the agents' message limit"
        limit = args[args.index("--websocket-max-message-size") + 1]
        assert int(limit) == SOCKET_MESSAGE_MAX_BYTES, f"daphne's message limit {limit}"
    elif prog == "celery":
        app = args[args.index("-A") + 1]
        path = _module_file(app)
        assert path and _defines(path, "app"), f"celery app {app} has no `app`"
        sub = args[args.index("-A") + 2]
        assert sub in {"worker", "beat", "inspect"}, f"celery subcommand {sub}"
        if "-Q" in args:
            queues = set(args[args.index("-Q") + 1].split(","))
            assert queues <= _queues(), f"unknown queues {queues - _queues()}"
    elif prog == "python" and args[:1] == ["manage.py"]:
        assert (ROOT / "manage.py").exists()
        assert args[1] in _management_commands(), f"no manage.py command {args[1]}"
    elif prog == "python" and args[:1] == ["-m"]:
        module = args[1]
        assert _module_file(module) or importlib.util.find_spec(module + ".__main__"), (
            f"no module {module}"
        )
        if module == "nodeagent":
            from nodeagent.config import build_parser

            build_parser().parse_args(args[2:])
        if module == "controlplane.healthcheck":
            from controlplane.healthcheck import CHECKS

            assert args[2] in CHECKS, f"no health check {args[2]}"
    elif prog == "python" and args[:1] == ["-c"]:
        compile(args[1], "<healthcheck>", "exec")
    elif prog in scripts:
        module, func = scripts[prog].split(":")
        path = _module_file(module)
        assert path and _defines(path, func), f"console script {prog} -> {scripts[prog]} missing"
        if prog == "prewarm-sim":
            from harness.cli import parse_args

            parse_args(args)
        if prog == "prewarm-agent":
            from nodeagent.config import build_parser

            build_parser().parse_args(args)
    else:
        raise AssertionError(f"unknown program {prog!r} in {argv}")


def _dockerfile(name: str) -> dict[str, list[str]]:
    """ENTRYPOINT, CMD and HEALTHCHECK CMD of a Dockerfile (exec form only)."""
    out: dict[str, list[str]] = {}
    text = (DOCKER / name).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        m = re.match(r"^(ENTRYPOINT|CMD|HEALTHCHECK)\s+(.*)$", line.strip())
        if m:
            body = m.group(2)
            if m.group(1) == "HEALTHCHECK":
                body = body[body.index("CMD") + 3 :].strip()
            out[m.group(1)] = json.loads(body)
    return out


def _services():
    return {name: svc for name, svc in COMPOSE["services"].items() if name not in THIRD_PARTY}


def _argv(svc: dict) -> list[str]:
    dockerfile = svc["build"]["dockerfile"].split("/")[-1]
    df = _dockerfile(dockerfile)
    cmd = svc.get("command", df.get("CMD"))
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    return df.get("ENTRYPOINT", []) + cmd


@pytest.mark.parametrize("service", sorted(_services()))
def test_every_service_runs_a_command_that_exists(service):
    svc = _services()[service]
    assert (ROOT / svc["build"]["context"].replace("..", ".")).exists()
    assert (DOCKER / svc["build"]["dockerfile"].split("/")[-1]).exists()
    check_command(_argv(svc))
    health = svc.get("healthcheck")
    if health:
        assert health["test"][0] == "CMD", "health checks use the exec form"
        check_command(health["test"][1:])


@pytest.mark.parametrize("dockerfile", ["Dockerfile.controlplane", "Dockerfile.agent"])
def test_dockerfile_entry_points_exist(dockerfile):
    df = _dockerfile(dockerfile)
    check_command(df.get("ENTRYPOINT", []) + df["CMD"])
    check_command(df["HEALTHCHECK"])
    for src in re.findall(r"^COPY\s+(.+?)\s+\S+$", (DOCKER / dockerfile).read_text(), re.M):
        for path in src.split():
            assert (ROOT / path).exists(), f"{dockerfile} copies {path}, which does not exist"


def test_a_worker_for_every_queue_and_exactly_one_beat():
    served = set()
    beats = 0
    for svc in _services().values():
        argv = _argv(svc)
        if argv[:1] == ["celery"] and "worker" in argv:
            served |= set(argv[argv.index("-Q") + 1].split(","))
        beats += argv[:1] == ["celery"] and "beat" in argv
    assert served == _queues()
    assert beats == 1


def test_the_images_pin_every_dependency_of_pyproject():
    """requirements/{controlplane,agent}.txt (what the Dockerfiles install) hold pyproject.toml's
    pins and the build backend, each name once and exactly pinned. That they hold everything
    those need too is what the image build checks: pip installs them from a wheelhouse of these
    files alone, with no index (tests/deploy/test_images.py)."""
    from packaging.requirements import Requirement

    from deploy import images

    for name, reqs in images.pins().items():
        locked: dict[str, str] = {}
        for line in images.LOCKS[name].read_text().splitlines():
            if line and not line.startswith("#"):
                m = re.fullmatch(r"([a-z0-9-]+)==(\S+)", line)
                assert m, f"{name}: {line!r} is not an exact pin"
                assert m.group(1) not in locked, f"{name}: {m.group(1)} twice"
                locked[m.group(1)] = m.group(2)
        for req in map(Requirement, reqs):
            pkg = images.canonical(req.name)
            assert pkg in locked, f"{name}: {req} is not locked"
            assert req.specifier.contains(locked[pkg]), f"{name}: {pkg}=={locked[pkg]}, not {req}"
    dockerfiles = {n: (DOCKER / f).read_text() for n, f in images.DOCKERFILES.items()}
    for name, text in dockerfiles.items():
        assert f"requirements/{name}.txt" in text, f"{images.DOCKERFILES[name]} installs no lock"


def test_the_agents_of_the_virtual_cluster_match_its_engine_count():
    vc = COMPOSE["services"]["vcluster"]["command"]
    engines = int(vc[vc.index("--engines") + 1])
    creds = COMPOSE["services"]["vcluster-credentials"]["command"]
    assert int(creds[creds.index("--agents") + 1]) == engines
    agents = [n for n in COMPOSE["services"] if n.startswith("vc-node-")]
    assert sorted(agents) == [f"vc-node-{i}" for i in range(engines)]


def test_example_env_names_only_settings_the_code_reads():
    code = "".join(p.read_text() for p in (ROOT / "controlplane" / "settings").glob("*.py"))
    for line in (DOCKER / "prewarm.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name = line.split("=", 1)[0]
            assert name.startswith("POSTGRES_") or f'"{name}"' in code, f"{name} is read by nothing"


def test_deploy_doc_covers_every_service():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for name in COMPOSE["services"]:
        base = re.sub(r"-\d+$", "", name)
        assert name in doc or base in doc, f"docs/deploy.md does not mention {name}"
    for topic in ("DaemonSet", "--kv-events-config", "TLS", "PostgreSQL", "Redis", "NVML"):
        assert topic in doc


def _stages(name: str) -> dict[str, set[str]]:
    """Each stage of a Dockerfile (by its ``AS`` name; the last one also as ``""``, what a build
    without a target makes) -> the top-level paths it copies, its base stage's included."""
    stages: dict[str, set[str]] = {}
    current: set[str] = set()
    for line in (DOCKER / name).read_text().replace("\\\n", " ").splitlines():
        if m := re.match(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line.strip(), re.I):
            current = set(stages.get(m.group(1), set()))
            stages[m.group(2) or ""] = current
        elif m := re.match(r"^COPY\s+(.+?)\s+\S+$", line.strip()):
            current |= {p.split("/")[0] for p in m.group(1).split()}
    stages.setdefault("", current)
    return stages


def _runs_package(argv: list[str]) -> str | None:
    """The top-level package of ours that ``argv`` imports first (None: none, or manage.py's)."""
    prog, args = argv[0], argv[1:]
    scripts = PYPROJECT["project"]["scripts"]
    if prog == "daphne":
        target = next(a for a in args if ":" in a and not a.startswith("-"))
    elif prog == "celery":
        target = args[args.index("-A") + 1]
    elif prog == "python" and args[:1] == ["-m"]:
        target = args[1]
    elif prog in scripts:
        target = scripts[prog]
    else:
        return None
    return target.split(":")[0].split(".")[0]


def test_each_image_ships_what_it_runs_and_only_the_virtual_cluster_the_harness():
    """The control-plane image holds no demo and test harness (its vcluster target adds it) and
    the agent image only the agent and the wire; every service's image holds what it runs."""
    agent, controlplane = _stages("Dockerfile.agent"), _stages("Dockerfile.controlplane")
    packages = {p for p in agent[""] if (ROOT / p / "__init__.py").exists()}
    assert packages == {"wire", "nodeagent"}, f"the agent image ships {sorted(packages)}"
    assert "harness" not in controlplane["controlplane"] | controlplane[""]
    assert controlplane["vcluster"] == controlplane["controlplane"] | {"harness"}
    for name, svc in _services().items():
        stage = _stages(svc["build"]["dockerfile"].split("/")[-1])[svc["build"].get("target", "")]
        argv = _argv(svc)
        package = _runs_package(argv)
        assert package is None or package in stage, f"{name} runs {argv[:3]}, not in its image"
        if package == "harness" or "harness" in stage:
            assert name == "vcluster", f"{name}'s image ships the harness"
