"""Build Prewarm's images with podman, offline: ``python -m deploy.images build|lock|check``.

    build   the base image (``mmdebstrap`` of the Debian release the Dockerfiles' default base
            names, with its Python, imported into podman), the wheelhouse (every pinned
            requirement as a wheel, built on this machine with its own pip configuration), then
            prewarm/controlplane and prewarm/agent from the two with ``--network none``
    lock    requirements/controlplane.txt and requirements/agent.txt: every dependency of the
            pins in pyproject.toml, pinned (resolved by pip for Linux x86_64 and Python 3.11)
    check   whether podman can run here; one line saying why not

The base and the wheelhouse are images in podman's own store, tagged with a hash of their inputs
(the Debian release and its packages; the pinned requirements and that release): each is made
once and reused until an input changes, and the images' dependency layers are cached by podman
the same way. The images are tagged as the chart names them (``image.*.repository`` and the
chart's appVersion). Every podman call runs with ``PODMAN`` and ``CONTAINERS_CONF`` below.
No Django here: this runs before any settings exist.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILES = {"controlplane": "Dockerfile.controlplane", "agent": "Dockerfile.agent"}
LOCKS = {name: ROOT / "requirements" / f"{name}.txt" for name in DOCKERFILES}
CHART = ROOT / "deploy" / "helm" / "prewarm"
# runc, not crun (crun refuses hybrid cgroup hierarchies), cgroupfs (no systemd needed), and
# containers.conf's empty default_ulimits (a machine may refuse setrlimit in containers).
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")
CONTAINERS_CONF = DOCKER / "containers.conf"
# What the base holds beyond Debian's essential packages: its Python with venv and pip, and
# what the public python image adds too: the CA bundle, the time zone database (Django's and
# Celery's zoneinfo read it: without it a worker dies at import) and /etc/services.
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates", "tzdata", "netbase")
BASE_REPO, WHEELS_REPO = "localhost/prewarm-base", "localhost/prewarm-wheels"


class Unavailable(RuntimeError):
    """podman (or mmdebstrap) cannot run here: one line saying why."""


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, check: bool = True, timeout: float | None = None):
    out = subprocess.run(
        [*PODMAN, *args], env=podman_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode:
        tail = (out.stderr or out.stdout).strip()[-3000:]
        raise RuntimeError(f"podman {' '.join(args[:2])} failed ({out.returncode}): {tail}")
    return out


def problem() -> str | None:
    """Why podman cannot build and run the images here, in one line; None when it can."""
    for tool, package in (("podman", "podman"), ("runc", "runc"), ("mmdebstrap", "mmdebstrap")):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            return (
                f"{tool} is not installed, and the image tests need podman, runc and mmdebstrap: "
                f"apt-get install podman runc mmdebstrap (missing: {package})"
            )
    out = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
    if out.returncode:
        last = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"podman cannot run here: {last[0]}"
    return None


# -- what the images are built from ----------------------------------------------------------


def default_base() -> str:
    """The Dockerfiles' default BASE (the public image), the same in both."""
    bases = {
        re.search(r"^ARG BASE=(\S+)$", (DOCKER / f).read_text(), re.M).group(1)
        for f in DOCKERFILES.values()
    }
    assert len(bases) == 1, f"the Dockerfiles name different bases: {sorted(bases)}"
    return bases.pop()


def release_of(base: str) -> tuple[str, str]:
    """(Python version, Debian release) of a python:X.Y-slim-RELEASE base."""
    m = re.search(r":(\d+\.\d+)-slim-([a-z]+)$", base)
    assert m, f"{base} does not name its Python and Debian release (python:X.Y-slim-RELEASE)"
    return m.group(1), m.group(2)


def image_names() -> dict[str, str]:
    """name -> the image the chart runs (its repository, tagged with the chart's appVersion)."""
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return {
        name: f"{values[name]['repository']}:{values[name]['tag'] or version}" for name in LOCKS
    }


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def _drop_older(repo: str, keep: str) -> None:
    """Other tags of ``repo`` (made from inputs since changed)."""
    out = podman("images", "--format", "{{.Repository}}:{{.Tag}}", repo, check=False)
    for tag in out.stdout.split():
        if tag != keep:
            podman("rmi", tag, check=False)


def ensure_base(log=print) -> str:
    python, release = release_of(default_base())
    arch = os.uname().machine
    tag = f"{BASE_REPO}:{release}-{_key(release, arch, *BASE_PACKAGES)}"
    if exists(tag):
        return tag
    log(f"images: making the {release} base with mmdebstrap (a few minutes) ...")
    with tempfile.TemporaryDirectory(prefix="prewarm-base-") as tmp:
        tar = Path(tmp) / "base.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=apt",
                f"--include={','.join(BASE_PACKAGES)}",
                release,
                str(tar),
            ],
            check=True,
        )
        podman("import", str(tar), tag)
    got = podman("run", "--rm", "--network", "none", tag, "python3", "-c", _PY_VERSION).stdout
    if got.strip() != python:
        podman("rmi", tag, check=False)
        raise RuntimeError(f"{release}'s Python is {got.strip()}, the images' base has {python}")
    _drop_older(BASE_REPO, tag)
    return tag


_PY_VERSION = "import sys; print('%d.%d' % sys.version_info[:2])"


def ensure_wheels(log=print) -> str:
    """The wheelhouse image: /wheels holds a wheel of every pinned requirement."""
    python, release = release_of(default_base())
    tag = f"{WHEELS_REPO}:{_key(release, python, *(p.read_text() for p in LOCKS.values()))}"
    if exists(tag):
        return tag
    here = "{}.{}".format(*sys.version_info[:2])
    if here != python:
        raise RuntimeError(
            f"the wheels are built with this Python ({here}); the images run {python}"
        )
    log("images: building the wheelhouse from the pinned requirements ...")
    with tempfile.TemporaryDirectory(prefix="prewarm-wheels-") as tmp:
        wheels = Path(tmp) / "wheels"
        for lock in LOCKS.values():
            _pip("wheel", "--no-deps", "-r", str(lock), "-w", str(wheels))
        tar = Path(tmp) / "wheels.tar"
        with tarfile.open(tar, "w") as t:
            t.add(wheels, arcname="wheels")
        podman("import", str(tar), tag)
    _drop_older(WHEELS_REPO, tag)
    return tag


def build_image(name: str, base: str, wheels: str) -> str:
    image = image_names()[name]
    before = podman("image", "inspect", "--format", "{{.Id}}", image, check=False).stdout.strip()
    podman(
        "build",
        "--network",
        "none",
        "--layers",
        "--build-arg",
        f"BASE={base}",
        "--build-arg",
        f"WHEELS={wheels}",
        "-f",
        str(DOCKER / DOCKERFILES[name]),
        "-t",
        image,
        str(ROOT),
    )
    after = podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    if before and before != after:
        podman("rmi", before, check=False)  # the previous build's image, untagged now
    return image


def build(log=print) -> dict[str, float]:
    """Base, wheelhouse and both images; seconds each step took."""
    times: dict[str, float] = {}
    t = time.monotonic()
    base = ensure_base(log)
    times["base"], t = time.monotonic() - t, time.monotonic()
    wheels = ensure_wheels(log)
    times["wheels"], t = time.monotonic() - t, time.monotonic()
    for name in DOCKERFILES:
        log(f"images: {image_names()[name]} from {base} and {wheels}")
        build_image(name, base, wheels)
        times[name], t = time.monotonic() - t, time.monotonic()
    return times


# -- the pinned requirements -----------------------------------------------------------------


def pins() -> dict[str, list[str]]:
    """name -> pyproject.toml's requirements of that image (the control plane's with the build
    backend, which installs the project itself)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {
        "controlplane": project["project"]["dependencies"] + project["build-system"]["requires"],
        "agent": project["project"]["optional-dependencies"]["agent"],
    }


HEADER = (
    "# Every dependency of the {name} image, pinned: pyproject.toml's pins and all they need,\n"
    "# resolved by pip for Linux x86_64 and Python 3.11.0 and up (`python -m deploy.images lock`\n"
    "# writes this file). docker/{dockerfile} installs exactly these, offline from the wheelhouse.\n"
)


def _pip(*args: str) -> None:
    """This machine's pip (its index, find-links and CA bundle); its output only on failure."""
    out = subprocess.run([sys.executable, "-m", "pip", "-q", *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"pip {args[0]} failed: {out.stderr[-3000:]}")


def _resolve(reqs: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        _pip("install", "--dry-run", "--ignore-installed", "--report", str(report), *reqs)
        return json.loads(report.read_text())["install"]


def _needed_elsewhere(items: list[dict]) -> list[str]:
    """Requirements of the resolved packages that this interpreter's markers drop but another
    Python 3.11 keeps (Debian's 3.11.2 needs async-timeout for redis, 3.11.7 does not): pip
    resolves for the Python it runs on, the images run any 3.11 from 3.11.0 to this one."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    have = {canonical(i["metadata"]["name"]) for i in items}
    envs = [default_environment(), {**default_environment(), "python_full_version": "3.11.0"}]
    out = []
    for item in items:
        for text in item["metadata"].get("requires_dist", []):
            req = Requirement(text)
            if canonical(req.name) in have or not req.marker:
                continue
            if any(req.marker.evaluate({**env, "extra": ""}) for env in envs):
                req.marker = None
                out.append(str(req))
    return out


def lock() -> None:
    for name, reqs in pins().items():
        items = _resolve(reqs)
        more = _needed_elsewhere(items)
        if more:
            items = _resolve(reqs + more)
        lines = sorted(
            f"{canonical(i['metadata']['name'])}=={i['metadata']['version']}" for i in items
        )
        text = HEADER.format(name=name, dockerfile=DOCKERFILES[name]) + "\n".join(lines) + "\n"
        LOCKS[name].write_text(text)
        print(f"{LOCKS[name].relative_to(ROOT)}: {len(lines)} pins")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.images", description=__doc__)
    parser.add_argument("command", choices=["build", "lock", "check"])
    args = parser.parse_args(argv)
    if args.command == "lock":
        lock()
        return 0
    why = problem()
    if why:
        print(f"images: {why}", file=sys.stderr)
        return 1
    if args.command == "build":
        times = build()
        print("images: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
        print("images: " + ", ".join(image_names().values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
