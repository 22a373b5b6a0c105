"""The Helm chart (deploy/helm/prewarm) renders, lints and validates, and what it renders runs.

Helm's own engine renders and lints it (helm-python-sdk: Helm v4 as a library, offline), and
every rendered object is validated against the Kubernetes schemas of each supported version
(kubernetes-validate, strict: an unknown field fails). Then the rendered objects are held to the
code: each container's command exists in its image, the control plane's settings load from the
environment the chart gives it, the agent's configuration loads with the agent's own loader, the
security defaults hold for every container, and the probes, hooks and policies are where they
must be. No cluster, no Docker engine, no network: the chart is rendered in-process.
"""

from __future__ import annotations

import ast
import base64
import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_compose import _dockerfile, check_command

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "prewarm"
VALUES_FILES = sorted(p.stem for p in (CHART / "ci").glob("*.yaml"))
# The Chart.yaml's kubeVersion (>=1.29) up to the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = [f"1.{minor}.0" for minor in range(29, 38)]
RELEASE, NAMESPACE = "prewarm", "prewarm"
# What the downward API would give (fieldRef -> value), to resolve a container's environment.
FIELDS = {
    "status.podIP": "10.42.0.7",
    "status.hostIP": "10.0.3.14",
    "spec.nodeName": "gpu-node-3",
    "metadata.name": "vllm-7d9f-abcde",
}
# Kinds of CRDs the chart may render, which kubernetes-validate has no schema for.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
PRODUCTION_SWITCH = ("DATABASE_URL", "REDIS_URL")  # without both: the embedded default


@pytest.fixture(autouse=True, scope="module")
def _schemas_read_once():
    # kubernetes-validate reads a version's 1.4 MB of definitions on every call; the files do
    # not change during a run.
    with pytest.MonkeyPatch.context() as mp:
        read = kubernetes_validate.utils.schema_contents
        mp.setattr(kubernetes_validate.utils, "schema_contents", functools.cache(read))
        yield


def values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / f"{name}.yaml").read_text()) or {}


def render_chart(chart: Path, vals: dict) -> list[dict]:
    with helm.Chart.load(chart) as loaded:
        out = loaded.render(values=copy.deepcopy(vals), name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(out.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@functools.cache
def _rendered(name: str) -> str:
    return json.dumps(render_chart(CHART, values(name)))


def rendered(name: str) -> list[dict]:
    return json.loads(_rendered(name))


def find(objs, kind, name=None):
    hits = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert hits, f"no {kind} {name or ''} rendered"
    return hits


def secret_values(objs, name, namespace=NAMESPACE) -> dict[str, str]:
    [secret] = [
        o
        for o in find(objs, "Secret", name)
        if o["metadata"].get("namespace", NAMESPACE) == namespace
    ]
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def sidecar_patch(objs) -> dict:
    [cm] = find(objs, "ConfigMap", f"{RELEASE}-agent-sidecar")
    return yaml.safe_load(cm["data"]["patch.yaml"])


def pod_specs(objs) -> list[tuple[str, dict]]:
    """(where, pod spec) of every workload, and of the sidecar patch's pod template."""
    out = []
    for o in objs:
        spec = o.get("spec", {})
        if "template" in spec and o["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
            out.append((f"{o['kind']}/{o['metadata']['name']}", spec["template"]["spec"]))
        if o["kind"] == "ConfigMap" and "patch.yaml" in o.get("data", {}):
            out.append(("sidecar patch", sidecar_patch(objs)["spec"]["template"]["spec"]))
    return out


def containers(objs, image_prefix: str = ""):
    """(where, pod spec, container) of every container and init container."""
    for where, spec in pod_specs(objs):
        for c in spec.get("initContainers", []) + spec["containers"]:
            if c["image"].startswith(image_prefix):
                yield f"{where}:{c['name']}", spec, c


def resolve_env(
    container: dict, objs: list[dict], namespace: str = NAMESPACE, fields: dict = FIELDS
) -> dict[str, str]:
    """The environment Kubernetes would give ``container``: secrets read from the rendered
    Secrets, the downward API from ``fields``, and $(VAR) expanded from the variables above it."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"])
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            value = secret_values(objs, ref["name"], namespace)[ref["key"]]
        else:
            value = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        env[item["name"]] = value
    return env


def expand_args(args: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def argv(container: dict) -> list[str]:
    """What the container runs: its command (or the image's ENTRYPOINT), then its args (or the
    image's CMD), as Kubernetes combines them."""
    image = container["image"].split(":")[0].split("/")[-1]
    df = _dockerfile(
        {"controlplane": "Dockerfile.controlplane", "agent": "Dockerfile.agent"}[image]
    )
    if "command" in container:
        return container["command"] + container.get("args", [])
    return df.get("ENTRYPOINT", []) + container.get("args", df.get("CMD", []))


# -- Helm's engine and the Kubernetes schemas ----------------------------------------------------


@pytest.mark.parametrize("name", VALUES_FILES)
def test_lints_clean(name):
    report = helm.lint(CHART, values(name), strict=True, kube_version="v1.29.0")
    problems = report["errors"] + [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems, problems


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_object_validates_against_each_supported_kubernetes(name):
    objs = rendered(name)
    if any(o["kind"] == "ConfigMap" and "patch.yaml" in o.get("data", {}) for o in objs):
        objs.append(patched_vllm_deployment(objs))
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue  # test_service_monitor_scrapes_the_metrics_endpoint checks it field by field
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {path}: {exc}")


def test_the_validator_refuses_what_kubernetes_would():
    # So that the test above can fail: a misspelt field, as strict validation sees it.
    [web] = find(rendered("minimal"), "Deployment", f"{RELEASE}-web")
    web["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBE_VERSIONS[0], strict=True)


def test_an_install_without_a_database_or_redis_fails_with_one_line():
    with pytest.raises(helm.HelmRenderError, match=r"database\.url \(DATABASE_URL\) is required"):
        render_chart(CHART, {"redis": {"url": "redis://r:6379/0"}})
    with pytest.raises(helm.HelmRenderError, match=r"redis\.url \(REDIS_URL\) is required"):
        render_chart(CHART, {"database": {"url": "postgres://d/p"}})


# -- the control plane --------------------------------------------------------------------------


def required_settings() -> set[str]:
    """Every environment variable controlplane/settings/ reads without a default (start-up
    fails without it), and the two whose absence means the embedded default."""
    names = set(PRODUCTION_SWITCH)
    for path in (ROOT / "controlplane" / "settings").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "get_from_env"
                and len(node.args) == 1
                and not any(k.arg in {"optional"} for k in node.keywords)
            ):
                names.add(node.args[0].value)
    return names


def test_required_settings_are_found_in_the_code():
    assert {"SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"} <= required_settings()


def load_settings(env: dict[str, str], tmp_path: Path) -> dict:
    """Import controlplane.settings in a fresh process with exactly ``env`` (nothing inherited:
    the test run's own DATABASE_URL must not stand in for the chart's)."""
    code = (
        "import json; from django.conf import settings as s; print(json.dumps({"
        "'embedded': s.EMBEDDED, 'hosts': s.ALLOWED_HOSTS, 'engine': s.DATABASES['default']"
        "['ENGINE'], 'broker': s.CELERY_BROKER_URL, 'secure': s.SECURE, 'redirect': "
        "s.SECURE_SSL_REDIRECT, 'key': len(s.SECRET_KEY)}))"
    )
    base = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",  # the image's ENV
        "PREWARM_DATA_DIR": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_control_plane_container_gets_every_required_setting(name, tmp_path):
    objs = rendered(name)
    envs = {}
    for where, _, c in containers(objs, "prewarm/controlplane"):
        env = resolve_env(c, objs)
        missing = required_settings() - set(env)
        assert not missing, f"{where} lacks {sorted(missing)}"
        envs[json.dumps(env, sort_keys=True)] = where
    # The settings themselves load from it, in production mode (one process per distinct env).
    for env_json in envs:
        loaded = load_settings(json.loads(env_json), tmp_path)
        assert not loaded["embedded"] and loaded["engine"] == "django.db.backends.postgresql"
        assert loaded["broker"].startswith(("redis://", "rediss://")) and loaded["key"] >= 50
        # kubelet probes and Prometheus send the pod's address as Host.
        assert FIELDS["status.podIP"] in loaded["hosts"] and f"{RELEASE}-web" in loaded["hosts"]
        assert loaded["secure"] and not loaded["redirect"]


# $(VAR) names the agent's args use, as their values (for check_command's argument parsing).
FIELDS_ENV = {"NODE_NAME": "gpu-node-3", "NODE_IP": "10.0.3.14", "POD_NAME": "vllm-7d9f-abcde"}


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_container_runs_an_entry_point_its_image_has(name):
    objs = rendered(name)
    seen = 0
    for where, _, c in containers(objs, "prewarm/"):
        try:
            check_command(expand_args(argv(c), FIELDS_ENV))
            for probe in ("livenessProbe", "readinessProbe"):
                if "exec" in c.get(probe, {}):
                    check_command(c[probe]["exec"]["command"])
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None
        seen += 1
    assert seen


def test_a_worker_for_every_queue_and_exactly_one_beat():
    from controlplane.celery import Queue

    objs = rendered("minimal")
    served, beats = set(), 0
    for _, _, c in containers(objs, "prewarm/controlplane"):
        cmd = c["command"]
        if cmd[:1] == ["celery"] and "worker" in cmd:
            served |= set(cmd[cmd.index("-Q") + 1].split(","))
        if cmd[:1] == ["celery"] and "beat" in cmd:
            beats += 1
    assert served == {q.value for q in Queue}
    [beat] = find(objs, "Deployment", f"{RELEASE}-beat")
    assert beats == 1 and beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"  # never two during an update


def test_probes_are_on_the_health_endpoints():
    from django.urls import resolve

    from controlplane.readmodels.metrics import MetricsView
    from controlplane.urls import healthz

    objs = rendered("minimal")
    [web] = find(objs, "Deployment", f"{RELEASE}-web")
    c = web["spec"]["template"]["spec"]["containers"][0]
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert resolve(get["path"]).func is healthz and get["port"] in port_names
    assert port_names["http"] == int(c["command"][c["command"].index("-p") + 1])
    for where, _, c in containers(objs, "prewarm/controlplane"):
        cmd = c["command"]
        if cmd[:1] == ["celery"]:
            role = "worker" if "worker" in cmd else "beat"
            probe = c["livenessProbe"]["exec"]["command"]
            assert probe == ["python", "-m", "controlplane.healthcheck", role], where
    # The metrics path the ServiceMonitor scrapes is the metrics view.
    assert resolve("/api/metrics/").func.view_class is MetricsView


def test_migrations_run_as_a_hook_job_before_the_pods_change():
    for name, hooks in (
        ("minimal", "pre-install,pre-upgrade"),
        ("trial", "post-install,pre-upgrade"),
    ):
        objs = rendered(name)
        [job] = find(objs, "Job", f"{RELEASE}-migrate")
        ann = job["metadata"]["annotations"]
        assert ann["helm.sh/hook"] == hooks
        spec = job["spec"]["template"]["spec"]
        # First of all it migrates (the fleet token's registration, if any, waits for it).
        first = (spec.get("initContainers") or spec["containers"])[0]
        assert first["command"] == ["python", "manage.py", "migrate", "--noinput"]
        # The Secret it reads is a hook too, made before it.
        [secret] = find(objs, "Secret", RELEASE)
        sann = secret["metadata"]["annotations"]
        assert sann["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert int(sann["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])
        assert sann["helm.sh/resource-policy"] == "keep"


def test_secret_key_is_generated_once_and_kept_across_upgrades(tmp_path):
    first = secret_values(rendered("minimal"), RELEASE)
    second = secret_values(render_chart(CHART, values("minimal")), RELEASE)
    # Random per render: were it not read back from the live Secret, an upgrade would change it.
    assert len(first["SECRET_KEY"]) >= 50 and first["SECRET_KEY"] != second["SECRET_KEY"]
    # An upgrade: the offline engine answers `lookup` with nothing, so a copy of the chart has
    # its one lookup answer what the live Secret of the release would hold.
    live = {"SECRET_KEY": "k" * 64, "FLEET_ENROLMENT_TOKEN": "pwe_" + "t" * 43}
    chart = tmp_path / "prewarm"
    shutil.copytree(CHART, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    lookup = (
        '{{- lookup "v1" "Secret" .Release.Namespace (include "prewarm.fullname" .) | toJson -}}'
    )
    assert lookup in text
    data = {k: base64.b64encode(v.encode()).decode() for k, v in live.items()}
    helpers.write_text(text.replace(lookup, json.dumps({"data": data})))
    objs = render_chart(chart, values("sidecar"))
    upgraded = secret_values(objs, RELEASE)
    assert upgraded["SECRET_KEY"] == live["SECRET_KEY"]
    assert upgraded["FLEET_ENROLMENT_TOKEN"] == live["FLEET_ENROLMENT_TOKEN"]
    # The agents' copy of the fleet token is the same token (one render decides it once).
    agent = secret_values(objs, f"{RELEASE}-agent", namespace="llm")
    assert agent["enrolment-token"] == live["FLEET_ENROLMENT_TOKEN"]


def test_the_fleet_enrolment_token_is_registered_with_the_control_plane():
    objs = rendered("daemonset")
    [job] = find(objs, "Job", f"{RELEASE}-migrate")
    [register] = job["spec"]["template"]["spec"]["containers"]
    cmd = register["command"]
    assert cmd[:3] == ["python", "manage.py", "ensure_fleet_enrolment_token"]
    assert cmd[cmd.index("--max-uses") + 1] == "256" and cmd[cmd.index("--ttl") + 1] == str(
        720 * 3600
    )
    env = resolve_env(register, objs)
    token = env["PREWARM_FLEET_ENROLMENT_TOKEN"]
    assert token.startswith("pwe_") and len(token) >= 40
    # The token the agents present is the one registered.
    [ds] = find(objs, "DaemonSet")
    agent_env = resolve_env(ds["spec"]["template"]["spec"]["containers"][0], objs)
    assert agent_env["PREWARM_AGENT_ENROLMENT_TOKEN"] == token
    # A release that runs no agents registers no token that nothing uses.
    [job] = find(rendered("minimal"), "Job", f"{RELEASE}-migrate")
    spec = job["spec"]["template"]["spec"]
    assert "initContainers" not in spec and [c["name"] for c in spec["containers"]] == ["migrate"]
    assert not [o for o in rendered("minimal") if o["metadata"]["name"] == f"{RELEASE}-agent"]


# -- the agent ----------------------------------------------------------------------------------


def agent_config(container: dict, objs, namespace=NAMESPACE, **extra_env):
    from nodeagent.config import load_config

    env = {**resolve_env(container, objs, namespace), **extra_env}
    args = argv(container)[3:]  # after python -m nodeagent
    return load_config(expand_args(args, env), env=env)


def test_the_sidecars_configuration_loads_with_the_agents_own_loader():
    objs = rendered("sidecar")
    patch = sidecar_patch(objs)
    [agent] = patch["spec"]["template"]["spec"]["containers"]
    cfg = agent_config(agent, objs, namespace="llm")
    [engine] = cfg.engines
    assert cfg.hostname == FIELDS["metadata.name"]  # each pod its own node
    assert cfg.control_plane_url == f"http://{RELEASE}-web.{NAMESPACE}.svc:8000"
    assert cfg.enrolment_token.startswith("pwe_") and cfg.state_dir == "/var/lib/prewarm-agent"
    assert engine.kv_events == "tcp://127.0.0.1:5557" and engine.openai_url.startswith("http://127")
    assert engine.tap_listen == "0.0.0.0:8100" and cfg.tap_tenant == "header:X-Tenant"
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports["prewarm-tap"] == 8100 and cfg.metrics_listen.endswith(
        f":{ports['prewarm-metrics']}"
    )
    assert agent["livenessProbe"]["httpGet"]["port"] == "prewarm-metrics"


def test_the_daemonsets_configuration_loads_and_it_needs_no_kubernetes_api():
    objs = rendered("daemonset")
    [ds] = find(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    [agent] = spec["containers"]
    cfg = agent_config(agent, objs)
    assert cfg.hostname == FIELDS["spec.nodeName"]  # NODE_NAME from the downward API
    assert cfg.transfer.listen == f"{FIELDS['status.hostIP']}:7701"
    assert [e.engine_id for e in cfg.engines] == ["vllm-0", "vllm-1"]
    assert {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    } in agent["env"]
    assert spec["hostNetwork"] and spec["automountServiceAccountToken"] is False
    # The agent reads no Kubernetes API: no Role, no binding, no token.
    assert not [o for o in objs if "Role" in o["kind"]]
    [sa] = find(objs, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == sa["metadata"]["name"]


def test_a_dropped_agent_setting_fails_the_loader():
    # So that the two tests above can fail: the sidecar without its control plane URL.
    from nodeagent.config import ConfigError

    objs = rendered("sidecar")
    [agent] = sidecar_patch(objs)["spec"]["template"]["spec"]["containers"]
    agent["env"] = [e for e in agent["env"] if e["name"] != "PREWARM_AGENT_CONTROL_PLANE_URL"]
    with pytest.raises(ConfigError, match="control_plane_url is required"):
        agent_config(agent, objs, namespace="llm")


# The vLLM Deployment of docs/deploy.md ("Kubernetes"), which the sidecar patch is applied to.
def docs_vllm_deployment() -> dict:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    [block] = re.findall(r"```yaml\n(# vllm\.yaml\n.*?)```", doc, re.S)
    return yaml.safe_load(block)


def patched_vllm_deployment(objs) -> dict:
    """kubectl patch's strategic merge of the sidecar patch into the docs' vLLM Deployment:
    labels merged, containers and volumes merged by name."""
    deployment = docs_vllm_deployment()
    patch = sidecar_patch(objs)["spec"]["template"]
    template = deployment["spec"]["template"]
    template["metadata"]["labels"].update(patch["metadata"]["labels"])
    for key in ("containers", "volumes"):
        mine = {x["name"] for x in patch["spec"][key]}
        template["spec"][key] = [x for x in template["spec"].get(key, []) if x["name"] not in mine]
        template["spec"][key] += patch["spec"][key]
    return deployment


def test_the_docs_vllm_deployment_patched_with_the_sidecar_runs_the_agent_beside_vllm():
    objs = rendered("sidecar")
    deployment = patched_vllm_deployment(objs)
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    spec = deployment["spec"]["template"]["spec"]
    vllm = next(c for c in spec["containers"] if c["name"] != "prewarm-agent")
    agent = next(c for c in spec["containers"] if c["name"] == "prewarm-agent")
    cfg = agent_config(agent, objs, namespace="llm")
    [engine] = cfg.engines
    # The agent reaches vLLM on the pod's loopback: its KV events, replay and HTTP ports.
    serve = vllm["args"]
    events = json.loads(serve[serve.index("--kv-events-config") + 1])
    assert events["endpoint"].rpartition(":")[2] == engine.kv_events.rpartition(":")[2]
    assert events["replay_endpoint"].rpartition(":")[2] == engine.replay.rpartition(":")[2]
    assert events["topic"] == engine.topic
    vllm_port = next(p["containerPort"] for p in vllm["ports"])
    assert engine.openai_url == f"http://127.0.0.1:{vllm_port}"
    tap = engine.tap_listen.rpartition(":")[2]
    assert str(vllm_port) != tap and "--enable-prompt-tokens-details" in serve
    assert deployment["spec"]["template"]["metadata"]["labels"]["prewarm.dev/agent"] == "true"


# -- security defaults, policies, observability --------------------------------------------------


def insecure(objs) -> list[str]:
    """Where a container misses a security default: non-root, read-only root file system, no
    privilege escalation, every capability dropped, seccomp RuntimeDefault, a memory limit."""
    problems = []
    for where, pod, c in containers(objs):
        sc, psc = c.get("securityContext", {}), pod.get("securityContext", {})
        checks = {
            "runAsNonRoot": sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True,
            "readOnlyRootFilesystem": sc.get("readOnlyRootFilesystem") is True,
            "allowPrivilegeEscalation": sc.get("allowPrivilegeEscalation") is False,
            "capabilities": sc.get("capabilities") == {"drop": ["ALL"]},
            "privileged": not sc.get("privileged"),
            "seccompProfile": sc.get("seccompProfile", psc.get("seccompProfile"))
            == {"type": "RuntimeDefault"},
            "memory limit": bool(c.get("resources", {}).get("limits", {}).get("memory")),
        }
        problems += [f"{where}: {name}" for name, ok in checks.items() if not ok]
    for where, pod in pod_specs(objs):
        if [v for v in pod.get("volumes", []) if "hostPath" in v]:
            problems.append(f"{where}: hostPath")
        if pod.get("hostPID") or pod.get("hostIPC"):
            problems.append(f"{where}: host PID/IPC")
    return problems


@pytest.mark.parametrize("name", VALUES_FILES)
def test_security_defaults_hold_for_every_container(name):
    objs = rendered(name)
    assert list(containers(objs))
    assert insecure(objs) == []


def test_a_dropped_security_setting_fails_the_check():
    objs = rendered("sidecar")
    [agent] = sidecar_patch(objs)["spec"]["template"]["spec"]["containers"]
    [cm] = find(objs, "ConfigMap", f"{RELEASE}-agent-sidecar")
    del agent["securityContext"]["capabilities"]
    patch = sidecar_patch(objs)
    patch["spec"]["template"]["spec"]["containers"] = [agent]
    cm["data"]["patch.yaml"] = yaml.safe_dump(patch)
    assert insecure(objs) == ["sidecar patch:prewarm-agent: capabilities"]


def test_network_policy_lets_agents_and_gateways_in_and_only_the_database_and_redis_out():
    for name in ("minimal", "trial"):
        objs = rendered(name)
        [web_np] = find(objs, "NetworkPolicy", f"{RELEASE}-web")
        [rule] = web_np["spec"]["ingress"]
        peers = [p.get("podSelector", {}).get("matchLabels", {}) for p in rule["from"]]
        assert {"prewarm.dev/agent": "true"} in peers and {"prewarm.dev/gateway": "true"} in peers
        [web] = find(objs, "Deployment", f"{RELEASE}-web")
        labels = web["spec"]["template"]["metadata"]["labels"]
        assert web_np["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        [egress] = find(objs, "NetworkPolicy", f"{RELEASE}-controlplane-egress")
        ports = {p["port"] for r in egress["spec"]["egress"] for p in r["ports"]}
        assert ports == {53, 5432, 6379}
        # Every control-plane pod is under the egress policy.
        selector = egress["spec"]["podSelector"]["matchLabels"]
        for o in objs:
            template = o.get("spec", {}).get("template")
            pod = template["spec"] if template else {}
            images = [c["image"] for c in pod.get("containers", []) + pod.get("initContainers", [])]
            if any(i.startswith("prewarm/controlplane") for i in images):
                assert selector.items() <= template["metadata"]["labels"].items(), o["kind"]
    trial = rendered("trial")
    [stores] = find(trial, "NetworkPolicy", f"{RELEASE}-datastores")
    [rule] = stores["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["prewarm.dev/controlplane"] == "true"


def test_external_database_and_redis_addresses_pin_the_egress():
    objs = rendered("external-services")
    [egress] = find(objs, "NetworkPolicy", f"{RELEASE}-controlplane-egress")
    rules = {r["ports"][0]["port"]: r.get("to") for r in egress["spec"]["egress"]}
    assert rules[5432] == [{"ipBlock": {"cidr": "10.20.0.0/24"}}]
    assert rules[6380] == [{"ipBlock": {"cidr": "10.20.1.0/24"}}]


def test_the_web_pods_have_a_disruption_budget():
    objs = rendered("minimal")
    [pdb] = find(objs, "PodDisruptionBudget")
    [web] = find(objs, "Deployment", f"{RELEASE}-web")
    assert pdb["spec"]["selector"] == web["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1 and web["spec"]["replicas"] >= 2


def test_service_monitor_scrapes_the_metrics_endpoint():
    objs = rendered("external-services")
    [sm] = find(objs, "ServiceMonitor")
    [svc] = find(objs, "Service", f"{RELEASE}-web")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert endpoint["path"] == "/api/metrics/"
    assert endpoint["authorization"]["type"] == "Bearer"  # a viewer's token: the API's rule
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not [o for o in rendered("minimal") if o["kind"] == "ServiceMonitor"]  # opt-in


def test_grafana_dashboard_configmap_is_the_shipped_dashboard():
    [cm] = find(rendered("minimal"), "ConfigMap", f"{RELEASE}-grafana-dashboard")
    shipped = (ROOT / "docs" / "grafana-dashboard.json").read_text()
    assert (CHART / "dashboards" / "prewarm.json").read_text() == shipped  # the chart's copy
    # Provisioned, not imported: the data source is named, no ${DS_PROMETHEUS} left to ask for.
    assert "${DS_" not in cm["data"]["prewarm.json"]
    expected = json.loads(shipped.replace("${DS_PROMETHEUS}", "prometheus"))
    assert json.loads(cm["data"]["prewarm.json"]) == expected
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_trial_statefulsets_are_single_replica_and_wired_to_the_control_plane():
    objs = rendered("trial")
    for component, port in (("postgresql", 5432), ("redis", 6379)):
        [sts] = find(objs, "StatefulSet", f"{RELEASE}-{component}")
        assert sts["spec"]["replicas"] == 1 and sts["spec"]["volumeClaimTemplates"]
        [svc] = find(objs, "Service", f"{RELEASE}-{component}")
        assert svc["spec"]["ports"][0]["port"] == port
    secrets = secret_values(objs, RELEASE)
    assert secrets["DATABASE_URL"].endswith(f"@{RELEASE}-postgresql:5432/prewarm")
    assert f":{secrets['POSTGRES_PASSWORD']}@" in secrets["DATABASE_URL"]
    assert secrets["REDIS_URL"] == f"redis://{RELEASE}-redis:6379/0"
    assert not [o for o in rendered("minimal") if o["kind"] == "StatefulSet"]


# -- values.schema.json --------------------------------------------------------------------------


def schema_refuses(vals: dict) -> str | None:
    with helm.Chart.load(CHART) as chart:
        try:
            chart.validate_schema(vals)
        except helm.HelmValuesError as exc:
            return str(exc)
    return None


def test_values_schema_refuses_misspelt_groups_and_wrong_urls():
    assert "workrs" in schema_refuses({"workrs": {}})
    assert "/database/url" in schema_refuses({"database": {"url": "mysql://db/prewarm"}})
    engine = {"engine_id": "v", "kv_events": "http://127.0.0.1:5557"}  # not a ZMQ endpoint
    assert "kv_events" in schema_refuses({"agent": {"sidecar": {"engine": engine}}})
    assert schema_refuses(values("external-services")) is None


@pytest.mark.parametrize(
    "tenant", ["model", "api-key", "header:X-Tenant", "user", "header:", "header:X Tenant"]
)
def test_values_schema_and_the_agent_agree_on_tap_tenant(tenant):
    from nodeagent.config import ConfigError, load_config

    try:
        load_config(
            ["--tap-tenant", tenant],
            env={"PREWARM_AGENT_CONTROL_PLANE_URL": "http://c", "PREWARM_AGENT_STATE_DIR": "/s"},
        )
        agent_accepts = True
    except ConfigError:
        agent_accepts = False
    assert (schema_refuses({"agent": {"tapTenant": tenant}}) is None) == agent_accepts
