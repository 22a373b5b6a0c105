"""The images, built and started the way the Helm chart runs them (podman, this machine's
PostgreSQL and Redis).

``deploy/images.py`` builds the base offline (mmdebstrap), the wheelhouse of the pinned
requirements and both images (cached in podman's store: warm, only the project's own layers are
rebuilt). Then the chart is rendered with Helm's engine, and every container this test starts
takes from the rendered objects, never from a copy: its image, command and arguments, its
environment (the Secret's DATABASE_URL, REDIS_URL, SECRET_KEY and fleet enrolment token, the
downward API as network host gives it), its pod's and its own security context (uid and gid,
read-only root file system, capabilities dropped, no privilege escalation) and its writable
mounts (each emptyDir a tmpfs, nothing else writable), and its probes. A security setting or a
volume kind this test cannot translate into podman's flags fails it.

In order: the migration Job's containers (migrate, then the fleet enrolment token), web (its
readiness probe, the dashboard's pages and static files), the `default` queue's worker and beat
(their liveness probes, run in the container as kubelet runs them), and the agent DaemonSet's
container, which enrols with the fleet token and reports an engine's blocks (a vLLM-format KV
event publisher on this machine) to web.

Network host, as the DaemonSet runs: the pods' and the node's address is 127.0.0.1. The one
change to what the chart renders: web's port (daphne's ``-p 8000``) becomes a free port, since
the machine's ports are shared; the agent's ports are values of the chart and are set free there.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import msgpack
import pytest
import redis

from deploy import images
from harness.event_publisher import TestPublisher
from harness.processes import free_port, pg_admin, wait_for
from tests.deploy.test_helm import (
    CHART,
    RELEASE,
    containers,
    expand_args,
    find,
    render_chart,
    resolve_env,
)
from wire import blockhash
from wire.protocol import TIER_GPU

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/prewarm")
REDIS_URL = os.environ.get("PREWARM_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
BLOCK = 16
# What podman's flags express of a pod's and a container's securityContext (the rest must be
# absent or the default: see security_flags).
POD_SECURITY = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"}
CONTAINER_SECURITY = {
    "runAsNonRoot",
    "runAsUser",
    "runAsGroup",
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "capabilities",
    "seccompProfile",
}


# -- the chart's settings as podman's flags ------------------------------------------------------


def security_flags(pod: dict, container: dict) -> list[str]:
    """podman run flags for the pod's and the container's securityContext and the container's
    volume mounts. Anything without a translation here fails, so a setting added to the chart is
    translated, never silently left out."""
    pod_sc, c_sc = pod.get("securityContext", {}), container.get("securityContext", {})
    assert set(pod_sc) <= POD_SECURITY, f"untranslated pod settings {set(pod_sc) - POD_SECURITY}"
    assert set(c_sc) <= CONTAINER_SECURITY, (
        f"untranslated container settings {set(c_sc) - CONTAINER_SECURITY}"
    )
    sc = {**pod_sc, **c_sc}  # the container's own win
    uid, gid = sc["runAsUser"], sc.get("runAsGroup", sc["runAsUser"])
    if sc.get("runAsNonRoot"):
        assert uid != 0, "runAsNonRoot with uid 0"
    flags = ["--user", f"{uid}:{gid}"]
    if "fsGroup" in pod_sc:
        flags += ["--group-add", str(pod_sc["fsGroup"])]
    # RuntimeDefault is podman's own default seccomp profile: nothing to add.
    assert sc.get("seccompProfile", {"type": "RuntimeDefault"}) == {"type": "RuntimeDefault"}
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if sc.get("readOnlyRootFilesystem"):
        # Without --read-only-tmpfs=false podman would add writable /tmp, /var/tmp and /run.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    caps = sc.get("capabilities", {})
    assert set(caps) <= {"drop", "add"}
    flags += [f"--cap-drop={c.lower()}" for c in caps.get("drop", [])]
    flags += [f"--cap-add={c}" for c in caps.get("add", [])]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        assert set(volume) == {"name", "emptyDir"} and not volume["emptyDir"], (
            f"volume {volume} has no translation to podman"
        )
        assert set(mount) == {"name", "mountPath"}, f"mount {mount} has no translation"
        # An emptyDir: an empty directory of the pod's own that its user can write (0777 in
        # Kubernetes). podman 4.3 ignores a tmpfs's mode= where the image has the directory
        # (root, 0755): U gives it to the container's user instead.
        flags += ["--tmpfs", f"{mount['mountPath']}:rw,exec,nosuid,nodev,U"]
    return flags


def test_the_charts_security_settings_become_podmans_flags():
    """Without podman: what the chart renders translates, and what it cannot is refused."""
    engine = {"engine_id": "vllm-0", "kv_events": "tcp://127.0.0.1:5557"}
    objs = render_chart(CHART, _values(8000, 9464, 7701, [engine], "http://127.0.0.1:8000"))
    [migrate] = find(objs, "Job", f"{RELEASE}-migrate")
    pod = migrate["spec"]["template"]["spec"]
    flags = security_flags(pod, pod["initContainers"][0])
    assert flags[:2] == ["--user", "10001:10001"] and "--read-only" in flags
    assert "--read-only-tmpfs=false" in flags and "--cap-drop=all" in flags
    assert "no-new-privileges" in flags
    assert [f.split(":")[0] for f in flags if f.startswith("/")] == ["/var/lib/prewarm", "/tmp"]
    broken = json.loads(json.dumps(pod["initContainers"][0]))
    broken["securityContext"]["privileged"] = True
    with pytest.raises(AssertionError, match="privileged"):
        security_flags(pod, broken)
    root = json.loads(json.dumps(pod["initContainers"][0]))
    root["securityContext"]["runAsUser"] = 0
    with pytest.raises(AssertionError, match="runAsNonRoot"):
        security_flags(pod, root)


# -- the run ---------------------------------------------------------------------------------------


def _values(web_port, metrics_port, transfer_port, engines, url, db_url="", redis_url=""):
    return {
        "database": {"url": db_url or "postgres://u:p@127.0.0.1:5432/prewarm"},
        "redis": {"url": redis_url or "redis://127.0.0.1:6379/0"},
        "agent": {
            "controlPlaneUrl": url,
            "metricsPort": metrics_port,
            "enrolment": {"labels": {"pool": "images-test"}},
            "daemonset": {
                "enabled": True,
                "runtimeClassName": "",
                "transferPort": transfer_port,
                "engines": engines,
            },
        },
    }


class Deployment:
    """The rendered chart's containers started with podman; everything removed by close()."""

    def __init__(self, objs: list[dict], web_port: int, node: str, tag: str):
        self.objs, self.web_port, self.tag = objs, web_port, tag
        self.fields = {
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
            "spec.nodeName": node,
            "metadata.name": node,
        }
        self.started: list[str] = []

    def container(self, where: str) -> tuple[dict, dict]:
        """(pod spec, container) of e.g. 'Deployment/prewarm-web:web'."""
        hits = [(pod, c) for w, pod, c in containers(self.objs) if w == where]
        assert hits, f"the chart renders no {where}"
        return hits[0]

    def ports(self, container: dict) -> dict[int, int]:
        """Container port -> the port it is on here (web's moved to a free one)."""
        return {8000: self.web_port} if container["name"] == "web" else {}

    def argv(self, pod: dict, container: dict, command: list[str] | None = None) -> list[str]:
        env = resolve_env(container, self.objs, fields=self.fields)
        name = f"prewarm-images-{self.tag}-{container['name']}"
        flags = ["--name", name, "--hostname", f"{container['name']}-{self.tag}"]
        flags += ["--network", "host", "--no-healthcheck", *security_flags(pod, container)]
        flags += [f"--env={k}={v}" for k, v in sorted(env.items())]
        command = command or container.get("command")
        args = [] if command is not container.get("command") else container.get("args", [])
        if command:
            command, args = expand_args(command, env), expand_args(args, env)
            if container["name"] == "web":  # the one change: daphne's port
                i = command.index("-p")
                command[i + 1] = str(self.web_port)
            flags += ["--entrypoint", json.dumps(command[:1])]
            args = command[1:] + args
        else:
            args = expand_args(container.get("args", []), env)
        return [*flags, container["image"], *args]

    def run_to_completion(self, where: str, command: list[str] | None = None, timeout=600) -> str:
        pod, c = self.container(where)
        argv = self.argv(pod, c, command)
        out = images.podman("run", "--rm", *argv, check=False, timeout=timeout)
        assert out.returncode == 0, f"{where} exited {out.returncode}: {out.stderr[-3000:]}"
        return out.stdout

    def start(self, where: str) -> str:
        pod, c = self.container(where)
        argv = self.argv(pod, c)
        images.podman("run", "-d", *argv)
        self.started.append(argv[1])
        return argv[1]

    def running(self, name: str) -> bool:
        out = images.podman("inspect", "--format", "{{.State.Running}}", name, check=False)
        return out.stdout.strip() == "true"

    def logs(self, name: str) -> str:
        out = images.podman("logs", "--tail", "60", name, check=False)
        return (out.stdout + out.stderr)[-6000:]

    def probe(self, name: str, container: dict, kind: str) -> str | None:
        """Run the container's probe as kubelet would: None when it passes, else why not."""
        probe = container[kind]
        timeout = probe.get("timeoutSeconds", 1)
        if "httpGet" in probe:
            port = probe["httpGet"]["port"]
            if isinstance(port, str):
                [port] = [p["containerPort"] for p in container["ports"] if p["name"] == port]
            port = self.ports(container).get(port, port)
            url = f"http://127.0.0.1:{port}{probe['httpGet']['path']}"
            try:
                status = httpx.get(url, timeout=timeout).status_code
            except httpx.HTTPError as exc:
                return f"{url}: {exc!r}"
            return None if 200 <= status < 400 else f"{url} answered {status}"
        command = probe["exec"]["command"]
        try:
            out = images.podman("exec", name, *command, check=False, timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            return f"{command} did not finish in {timeout + 30} s"
        return None if out.returncode == 0 else f"{command}: {out.stderr.strip()[-300:]}"

    def wait_probe(self, where: str, kind: str) -> None:
        """Until the probe passes; at most twice what kubelet tolerates before acting (a loaded
        machine starts slowly), and never once the container has exited."""
        pod, c = self.container(where)
        name = f"prewarm-images-{self.tag}-{c['name']}"
        p = c[kind]
        budget = p.get("initialDelaySeconds", 0) + p.get("periodSeconds", 10) * p.get(
            "failureThreshold", 3
        )
        last: list[str | None] = [None]

        def passes() -> bool:
            assert self.running(name), f"{where} exited: {self.logs(name)}"
            last[0] = self.probe(name, c, kind)
            return last[0] is None

        try:
            wait_for(passes, max(2 * budget, 120), interval=1.0, what=f"{where} {kind}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last: {last[0]}; logs:\n{self.logs(name)}") from None

    def close(self) -> None:
        for name in reversed(self.started):
            images.podman("rm", "-f", "-t", "10", name, check=False)


@pytest.fixture(scope="module")
def built():
    why = images.problem()
    if why:
        pytest.skip(why)
    started = time.monotonic()
    times = images.build(log=print)
    print(f"images built in {time.monotonic() - started:.0f} s: {times}")


@pytest.fixture
def database():
    name = f"prewarm_images_{uuid.uuid4().hex[:10]}"
    pg_admin(PG_URL, f'CREATE DATABASE "{name}"')
    yield urlsplit(PG_URL)._replace(path=f"/{name}").geturl()
    pg_admin(PG_URL, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def broker():
    """The test run's Redis database, emptied before and after (beat fills queues that only
    the other queues' workers, not started here, would drain)."""
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()


@pytest.mark.services
@pytest.mark.images
@pytest.mark.slow
def test_the_images_start_under_the_charts_security_settings(built, database, broker, tmp_path):
    publisher = TestPublisher()
    tag = uuid.uuid4().hex[:8]
    node = f"images-node-{tag}"
    web_port, metrics_port, transfer_port = free_port(), free_port(), free_port()
    engine = {
        "engine_id": "vllm-0",
        "kv_events": publisher.endpoint,
        "replay": publisher.replay_endpoint,
        "topic": "kv",
        "block_size": BLOCK,
        "model": "images-test",
    }
    url = f"http://127.0.0.1:{web_port}"
    values = _values(web_port, metrics_port, transfer_port, [engine], url, database, broker)
    objs = render_chart(CHART, values)
    run = Deployment(objs, web_port, node, tag)
    try:
        # The hook Job: migrate (its init container), then the fleet enrolment token.
        run.run_to_completion(f"Job/{RELEASE}-migrate:migrate")
        run.run_to_completion(f"Job/{RELEASE}-migrate:fleet-enrolment-token")

        run.start(f"Deployment/{RELEASE}-web:web")
        run.start(f"Deployment/{RELEASE}-worker-default:worker")
        run.start(f"Deployment/{RELEASE}-beat:beat")
        run.wait_probe(f"Deployment/{RELEASE}-web:web", "readinessProbe")
        run.wait_probe(f"Deployment/{RELEASE}-web:web", "livenessProbe")

        # The dashboard's pages and static files, from the installed package's data.
        page = httpx.get(f"{url}/login/", timeout=10)
        assert page.status_code == 200 and "ui/app.css" in page.text, page.text[:500]
        for path, source in (
            ("/ui/app.css", ROOT / "frontend" / "static" / "frontend" / "app.css"),
            ("/ui/cachemap.js", ROOT / "frontend" / "static" / "frontend" / "cachemap.js"),
        ):
            got = httpx.get(f"{url}{path}", timeout=10)
            assert got.status_code == 200 and got.content == source.read_bytes(), path
        plotly = httpx.get(f"{url}/ui/plotly.min.js", timeout=30)
        assert plotly.status_code == 200 and len(plotly.content) > 1_000_000
        swagger = httpx.get(f"{url}/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui.css")
        assert swagger.status_code == 200 and len(swagger.content) > 10_000

        run.wait_probe(f"Deployment/{RELEASE}-worker-default:worker", "livenessProbe")
        run.wait_probe(f"Deployment/{RELEASE}-beat:beat", "livenessProbe")

        # The agent enrols with the fleet token the Job registered, then reports its engine.
        run.start(f"DaemonSet/{RELEASE}-agent:agent")
        run.wait_probe(f"DaemonSet/{RELEASE}-agent:agent", "livenessProbe")
        token = run.run_to_completion(
            f"Job/{RELEASE}-migrate:migrate",
            ["python", "manage.py", "ensure_user", "images", "--password", uuid.uuid4().hex]
            + ["--role", "viewer", "--issue-token", "images-test"],
        )
        token = token.strip().splitlines()[-1]
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)

        publisher.wait_subscribed(timeout=60)
        tokens = [(t * 7 + 3) % 2000 for t in range(4 * BLOCK)]
        keys = blockhash.chain_keys(tokens, BLOCK)
        hashes = [int.from_bytes(os.urandom(7), "big") for _ in keys]
        event = ["BlockStored", hashes, None, tokens, BLOCK, None, TIER_GPU]
        publisher.publish(b"kv", 1, msgpack.packb([time.time(), [event], 0]))

        def reported():
            nodes = [n for n in api.get("/api/nodes/").json()["results"] if n["name"] == node]
            engines = [e for e in api.get("/api/engines/").json()["results"]]
            mine = [e for e in engines if e["node_name"] == node and e["engine_id"] == "vllm-0"]
            if nodes and mine and sum(mine[0]["blocks"].values()) == len(keys):
                return nodes[0], mine[0]
            return None

        agent_name = f"prewarm-images-{tag}-agent"
        try:
            found, eng = wait_for(reported, 120, interval=1.0, what="the agent's report")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{run.logs(agent_name)}") from None
        assert found["labels"].get("pool") == "images-test"  # the chart's enrolment labels
        assert found["state"] == "active" and found["reports_applied"] >= 1
        for name in run.started:  # nothing died along the way
            assert run.running(name), f"{name} exited: {run.logs(name)}"
    finally:
        run.close()
        publisher.close()


def test_where_podman_cannot_run_one_line_says_what_to_install(monkeypatch):
    real = images.shutil.which
    monkeypatch.setattr(
        images.shutil, "which", lambda tool, path=None: None if tool == "mmdebstrap" else real(tool)
    )
    why = images.problem()
    assert why and "\n" not in why and "apt-get install podman runc mmdebstrap" in why
