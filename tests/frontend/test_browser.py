"""The dashboard in Debian's chromium, against daphne (websockets included) on a file SQLite DB.

Run with `-m browser`. Screenshots of every page (1440x900) go to test-artifacts/screenshots/.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness import fleet_seed as cluster
from harness.live import LiveControlPlane

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
# A delta reaches the page within the coalescing interval (0.1 s) and one REST refetch; the
# ceiling is for a busy machine, a passing test never waits for it.
LIVE_CEILING_MS = 30_000


def _run(env, *args) -> str:
    out = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed")
    tmp = tmp_path_factory.mktemp("dash")
    env = {
        **os.environ,
        "PREWARM_DATA_DIR": str(tmp),
        "SQLITE_PATH": str(tmp / "db.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "PREWARM_NODE_STALE_SECONDS": "3600",
        # Approved items are copied, none held out at random: the plan test approves one item
        # and waits for it to show approved (with the default 15% it was held out 1 run in 7).
        "PREWARM_HOLDOUT_FRACTION": "0",
    }
    _run(env, "manage.py", "migrate", "-v", "0")
    seed = json.loads(_run(env, "-m", "tests.frontend.browser_seed", "base"))
    server = LiveControlPlane(tmp, env=env)  # its log: <tmp>/daphne.log
    url = server.url
    try:
        server.start(timeout=30)
        agents = [
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {seed[k]}"})
            for k in ("agent_token", "agent_token_2")
        ]
        chains = seed["chains"]
        tenants = list(chains)
        # Node 1: engines hold the two hottest prefixes in part or whole; node 2 starts empty.
        first = {
            "vllm-0": cluster.stored(chains[tenants[0]]),
            "vllm-1": cluster.stored(chains[tenants[1]][:2]),
        }
        for agent, node, residency in (
            (agents[0], "gpu-node-01", first),
            (agents[1], "gpu-node-02", {}),
        ):
            resp = agent.post(
                "/api/agents/report/",
                json=cluster.report(1, node, engines=2, mode="snapshot", residency=residency),
            )
            assert resp.status_code == 200, resp.text
        seed.update(json.loads(_run(env, "-m", "tests.frontend.browser_seed", "plans")))
        yield {"url": url, "agents": agents, "seed": seed, "env": env}
        for agent in agents:
            agent.close()
    finally:
        server.close()


@pytest.fixture(scope="module")
def browser(live):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def page_as(browser, live, role, hold_socket=False):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    if (
        hold_socket
    ):  # the dashboard socket opens but nothing ever arrives: a slow server's first seconds
        context.route_web_socket(re.compile(r"/ws/dashboard/$"), lambda ws: None)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.goto(f"{live['url']}/login/")
    page.fill("#id_username", role)
    page.fill("#id_password", cluster.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live['url']}/")
    return page


def shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_sign_in_as_each_role(browser, live, role):
    page = page_as(browser, live, role)
    assert page.inner_text("#role") == role
    page.wait_for_selector('#live[data-state="open"]')
    assert page.locator('nav a[href="/audit/"]').count() == (0 if role == "viewer" else 1)
    page.click("text=Sign out")
    page.wait_for_url(f"{live['url']}/login/")
    page.goto(f"{live['url']}/plans/")
    assert "/login/" in page.url  # signed out for real
    assert page.errors == []
    page.context.close()


def test_cache_map_changes_when_an_agent_reports(browser, live):
    page = page_as(browser, live, "viewer")
    page.wait_for_selector('#live[data-state="open"]')
    page.wait_for_selector("#cmap td")
    engine = live["seed"]["engines"][2]  # gpu-node-02/vllm-0, empty so far
    cell = f'tr[data-engine="{engine}"] td[data-col="2"]'
    assert page.get_attribute(cell, "data-state") == "a"
    shot(page, "01-cache-map")
    tenants = list(live["seed"]["chains"])
    body = cluster.report(
        2,
        "gpu-node-02",
        engines=2,
        residency={"vllm-0": cluster.stored(live["seed"]["chains"][tenants[2]])},
    )
    assert live["agents"][1].post("/api/agents/report/", json=body).status_code == 200
    page.wait_for_selector(f'{cell}[data-state="r"]', timeout=LIVE_CEILING_MS)
    assert "changed" in page.get_attribute(cell, "class")
    page.hover(cell)
    assert "resident" in page.inner_text("#cell-detail")
    shot(page, "02-cache-map-after-report")
    assert page.errors == []
    page.context.close()


def test_cache_map_has_figures_and_rows_before_the_socket_says_anything(browser, live):
    page = page_as(browser, live, "viewer", hold_socket=True)
    page.wait_for_selector("#cmap td")  # the table comes from GET /api/cache-map/
    nodes = page.evaluate("async () => (await fetch('/api/nodes/')).json()")["results"]
    engines = page.evaluate("async () => (await fetch('/api/engines/')).json()")["count"]
    figures = {
        k: page.inner_text(f'[data-stat="{k}"]')
        for k in ("nodes", "stale", "engines", "plans", "jobs")
    }
    assert figures["nodes"] == str(sum(n["state"] == "active" for n in nodes)) != "0"
    assert figures["stale"] == str(sum(n["state"] == "stale" for n in nodes))
    assert figures["engines"] == str(engines) and engines > 0
    assert figures["plans"].isdigit() and figures["jobs"].isdigit()
    assert page.locator("#cmap tbody tr[data-engine]").count() == engines
    assert page.evaluate("window.__prewarmLastMessage === undefined")  # no snapshot arrived
    shot(page, "00-cache-map-first-paint")
    assert page.errors == []
    page.context.close()


def test_api_docs_list_the_operations_offline(browser, live):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors, elsewhere = [], []
    page.on(
        "console", lambda m: m.type == "error" and errors.append(m.text)
    )  # CSP refusals land here
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "request",
        lambda r: (
            r.url.startswith(live["url"]) or r.url.startswith("data:") or elsewhere.append(r.url)
        ),
    )
    page.goto(f"{live['url']}/api/docs/")
    page.wait_for_selector(".opblock")
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/nodes/" in paths and "/api/agents/report/" in paths and len(paths) >= 30
    shot(page, "00-api-docs-top")
    page.click("#operations-nodes-nodes_list .opblock-summary")  # an operation opens
    page.wait_for_selector("#operations-nodes-nodes_list .opblock-body")
    shot(page, "00-api-docs")
    assert errors == [] and elsewhere == []
    context.close()


def test_viewer_cannot_approve_and_operator_can(browser, live):
    plan, items = live["seed"]["plan"], live["seed"]["items"]
    viewer = page_as(browser, live, "viewer")
    viewer.goto(f"{live['url']}/plans/{plan}/")
    assert viewer.locator("button[data-approve]").count() == 0
    assert "operators and admins approve" in viewer.inner_text("#cannot-decide")
    # Even a hand-made request from the viewer's page is refused by the server.
    status = viewer.evaluate(
        """async ([plan]) => (await fetch(`/api/plans/${plan}/approve/`, {method: "POST",
              headers: {"X-CSRFToken": document.querySelector('meta[name="csrf-token"]').content,
                        "Content-Type": "application/json"}, body: "{}"})).status""",
        [plan],
    )
    assert status == 403
    shot(viewer, "05-plan-viewer")
    viewer.context.close()

    # The plans list, open in another tab, follows the decision live (a plan.decided delta).
    watcher = page_as(browser, live, "viewer")
    watcher.goto(f"{live['url']}/plans/")
    watcher.wait_for_selector('#live[data-state="open"]')
    listed = f'tr[data-plan="{plan}"] [data-field="state"]'

    operator = page_as(browser, live, "operator")
    operator.goto(f"{live['url']}/plans/{plan}/")
    assert operator.inner_text(f'tr[data-item="{items[0]}"] [data-field="decision"]') == "pending"
    operator.check(f'input[name="item"][value="{items[0]}"]')
    operator.click('button[data-approve="1"][data-scope="selected"]')
    operator.wait_for_selector(f'tr[data-item="{items[0]}"] .state-approved')
    assert operator.inner_text("#plan-state") == "partially_approved"
    operator.click('button[data-approve="0"][data-scope="all"]')
    operator.wait_for_selector(f'tr[data-item="{items[1]}"] .state-rejected')
    assert operator.inner_text("#plan-state") == "partially_approved"
    shot(operator, "06-plan-operator-decided")
    watcher.wait_for_selector(f"{listed}.state-partially_approved", timeout=LIVE_CEILING_MS)
    assert watcher.errors == []
    watcher.context.close()
    data = operator.evaluate(f"async () => (await fetch('/api/plans/{plan}/')).json()")
    assert {i["id"]: i["decision"] for i in data["items"]} == {
        items[0]: "approved",
        items[1]: "rejected",
        items[2]: "rejected",
    }
    assert operator.errors == []
    operator.context.close()


def test_jobs_page_follows_a_job_live(browser, live):
    """The seeded running job (both its engines on gpu-node-01): its agent's progress and result
    reach its row on the jobs page as job.update deltas, keyed by job_id."""
    url, agent = live["url"], live["agents"][0]
    page = page_as(browser, live, "viewer")
    jobs = page.evaluate("async () => (await fetch('/api/replication-jobs/')).json()")["results"]
    job = next(j for j in jobs if j["state"] == "running")
    page.goto(f"{url}/jobs/")
    page.wait_for_selector('#live[data-state="open"]')
    row = f'tr[data-job="{job["id"]}"]'
    assert page.get_attribute(f"{row} .progress", "aria-valuenow") != "75"
    events = f"/api/agents/jobs/{job['id']}/events/"
    assert agent.post(events, json={"type": "job.ack", "job_id": job["id"]}).status_code == 200
    progress = {"type": "job.progress", "job_id": job["id"], "bytes_done": job["bytes"] * 3 // 4}
    assert agent.post(events, json=progress).status_code == 200
    page.wait_for_selector(f'{row} .progress[aria-valuenow="75"]', timeout=LIVE_CEILING_MS)
    result = {
        "type": "job.result",
        "job_id": job["id"],
        "state": "succeeded",
        "checksum": "ab" * 32,
        "bytes": job["bytes"],
        "error": None,
    }
    assert agent.post(events, json=result).status_code == 200
    page.wait_for_selector(f"{row} .state-landed", timeout=LIVE_CEILING_MS)
    assert page.get_attribute(f"{row} .progress", "aria-valuenow") == "100"
    shot(page, "07-jobs-live")
    assert page.errors == []
    page.context.close()


def test_invalid_policy_is_refused_and_nothing_saved(browser, live):
    policy = live["seed"]["policy"]
    operator = page_as(browser, live, "operator")
    operator.goto(f"{live['url']}/policies/")
    assert operator.locator("form[data-api]").count() == 0  # operators only read policies
    operator.context.close()

    admin = page_as(browser, live, "admin")
    admin.goto(f"{live['url']}/policies/")
    before = admin.evaluate(f"async () => (await fetch('/api/policies/{policy}/')).json()")
    form = f'form[data-policy="{policy}"]'
    admin.fill(f'{form} input[name="min_confidence"]', "1.5")
    admin.fill(f'{form} input[name="replica_ttl_seconds"]', "600")
    admin.click(f"{form} button[type=submit]")
    admin.wait_for_selector(f"{form} .notice.error")
    assert "Not saved" in admin.inner_text(f"{form} .result")
    assert "less than or equal to 1" in admin.inner_text(f'{form} [data-error="min_confidence"]')
    shot(admin, "08-policy-invalid")
    after = admin.evaluate(f"async () => (await fetch('/api/policies/{policy}/')).json()")
    assert after == before  # the valid TTL next to the bad value was not saved either
    assert admin.errors == []
    admin.context.close()


def test_a_policy_saved_from_its_form_reaches_the_model(browser, live):
    """The form sends the API's names (``horizon_seconds``); the model's ``horizon_s`` holds the
    value, and the reloaded form shows it."""
    policy = live["seed"]["policy"]
    admin = page_as(browser, live, "admin")
    admin.goto(f"{live['url']}/policies/")
    form = f'form[data-policy="{policy}"]'
    field = f'{form} input[name="horizon_seconds"]'
    before = admin.evaluate(f"async () => (await fetch('/api/policies/{policy}/')).json()")
    for value in (420, before["horizon_seconds"]):  # then back, for the module's other tests
        admin.fill(field, str(value))
        with admin.expect_navigation():  # saved, the page reloads
            admin.click(f"{form} button[type=submit]")
            admin.wait_for_selector(f"{form} .notice.ok")
        after = admin.evaluate(f"async () => (await fetch('/api/policies/{policy}/')).json()")
        assert after["horizon_seconds"] == value and "horizon_s" not in after
        assert admin.input_value(field) == str(value)  # the reloaded form shows the model's
    assert admin.errors == []
    admin.context.close()


def test_misses_page_draws_the_reasons_gateways_records_got(browser, live):
    """Records posted through the API get reasons at ingest; the page charts them per tenant."""
    url, chains = live["url"], live["seed"]["chains"]
    tenants = list(chains)
    now = time.time()
    records = [  # on gpu-node-01/vllm-0, which holds tenant 0's chain (stored at start-up)
        {
            "time": now,
            "model": "llama3-70b",
            "tenant": tenants[0],
            "keys": chains[tenants[0]],
            "block_size": 16,
            "cached_tokens": 16 * len(chains[tenants[0]]),
            "engine": "gpu-node-01/vllm-0",
        },
        {  # nothing of tenant 3's chain is resident anywhere
            "time": now,
            "model": "llama3-70b",
            "tenant": tenants[3],
            "keys": chains[tenants[3]],
            "block_size": 16,
            "cached_tokens": 0,
            "engine": "gpu-node-01/vllm-0",
        },
    ]
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {live['seed']['gateway']}"}
    ) as gw:
        resp = gw.post("/api/request-records/", json={"records": records})
        assert resp.status_code == 200, resp.text
    page = page_as(browser, live, "viewer")
    assert page.goto(f"{url}/misses/").status == 200
    page.wait_for_selector(".reason-chart .main-svg")
    page.wait_for_selector("#sol-chart .main-svg")
    hit = page.text_content(f'tr[data-tenant="{tenants[0]}"] td[data-reason="hit"]')
    cold = page.text_content(f'tr[data-tenant="{tenants[3]}"] td[data-reason="cold"]')
    assert (hit, cold) == ("1", "1")
    charts = page.eval_on_selector_all(".reason-chart", "els => els.map(e => e.dataset.tenant)")
    assert set(charts) >= {tenants[0], tenants[3]}
    shot(page, "13-misses")
    assert page.errors == []
    page.context.close()


def test_screenshots_of_every_page(browser, live):
    seed, url = live["seed"], live["url"]
    page = page_as(browser, live, "admin")
    engine = seed["engines"][0]
    pages = [
        ("03-node", "/nodes/1/"),
        ("04-engine", f"/engines/{engine}/"),
        ("04-gpu", "/gpus/1/"),
        ("05-plans", "/plans/"),
        ("07-jobs", "/jobs/"),
        ("08-policies", "/policies/"),
        ("09-overrides", "/overrides/"),
        ("10-forecasts", "/forecasts/"),
        ("11-scoreboard", "/scoreboard/"),
        ("12-audit", "/audit/"),
    ]
    for name, path in pages:
        resp = page.goto(url + path)
        assert resp.status == 200, path
        page.wait_for_load_state("networkidle")
        if path.startswith(("/nodes", "/gpus", "/engines", "/forecasts")):
            page.wait_for_selector(".main-svg")  # Plotly drew the chart
        shot(page, name)
    assert page.errors == []
    page.context.close()
    login = browser.new_page(viewport={"width": 1440, "height": 900})
    login.goto(f"{url}/login/")
    shot(login, "00-login")
    login.close()


def test_forecasts_key_table_stays_beside_the_detail_panel(browser, live):
    """At 1440 px the workload-key table fits its panel and ends before the detail panel starts
    (it used to run under it: a fixed-width panel round a table wider than it)."""
    key = json.loads(_run(live["env"], "-m", "tests.frontend.browser_seed", "long_names"))["key"]
    page = page_as(browser, live, "viewer")
    page.goto(f"{live['url']}/forecasts/?key={key}")  # the widest row, selected
    page.wait_for_selector("#forecast-detail .main-svg")  # Plotly drew the chart
    keys = page.locator("#forecast-keys").bounding_box()
    table = page.locator("#forecast-keys table").bounding_box()
    detail = page.locator("#forecast-detail").bounding_box()
    shot(page, "10-forecasts-selected")
    assert table["x"] + table["width"] <= keys["x"] + keys["width"] + 0.5, (table, keys)
    assert keys["x"] + keys["width"] <= detail["x"], (keys, detail)
    assert detail["width"] >= 600, detail  # the chart keeps room to be read
    assert page.errors == []
    page.context.close()


def test_admin_retires_a_node_allows_re_enrolment_and_reassigns_a_claimed_gpu(browser, live):
    """The node page's and the GPU page's admin actions, through the REST API they call; a
    viewer sees none of them (and the API refuses a hand-made one)."""
    url = live["url"]
    fleet = _run(live["env"], "manage.py", "create_enrolment_token", "--max-uses", "4").strip()
    with httpx.Client(base_url=url) as anon:
        ids, agents = {}, {}
        for name in ("gpu-node-03", "gpu-node-04"):
            resp = anon.post(
                "/api/agents/enrol/", json={"enrolment_token": fleet, "hostname": name}
            )
            assert resp.status_code == 201, resp.text
            ids[name] = resp.json()["node_id"]
            agents[name] = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {resp.json()['agent_token']}"}
            )
        gpu_uuid = "GPU-gpu-node-03-0"
        assert (
            agents["gpu-node-03"]
            .post("/api/agents/report/", json=cluster.report(1, "gpu-node-03"))
            .is_success
        )
        squat = cluster.report(1, "gpu-node-04")  # node 04 reports node 03's GPU
        squat["gpus"][0]["uuid"] = gpu_uuid
        squat["engines"][0]["gpu_uuids"] = [gpu_uuid]
        resp = agents["gpu-node-04"].post("/api/agents/report/", json=squat)
        assert resp.status_code == 200 and resp.json()["gpus_refused"] == [gpu_uuid], resp.text
        try:
            _admin_actions(browser, live, ids, agents, squat, anon, fleet)
        finally:
            for agent in agents.values():
                agent.close()


def _admin_actions(browser, live, ids, agents, squat, anon, fleet):
    url, gpu_uuid = live["url"], squat["gpus"][0]["uuid"]
    viewer = page_as(browser, live, "viewer")
    gpus = viewer.evaluate(
        f"async () => (await fetch('/api/gpus/?node={ids['gpu-node-03']}')).json()"
    )["results"]
    gpu = next(g["id"] for g in gpus if g["uuid"] == gpu_uuid)
    viewer.goto(f"{url}/nodes/{ids['gpu-node-04']}/")
    assert gpu_uuid in viewer.inner_text("#gpus-refused")  # shown on the claimant's page
    viewer.goto(f"{url}/nodes/{ids['gpu-node-03']}/")
    assert "claimed by gpu-node-04" in viewer.inner_text("table.data")
    assert viewer.locator("#node-admin, #retire-node, #allow-reenrolment").count() == 0
    status = viewer.evaluate(
        """async ([node]) => (await fetch(`/api/nodes/${node}/`, {method: "PATCH",
              headers: {"X-CSRFToken": document.querySelector('meta[name="csrf-token"]').content,
                        "Content-Type": "application/json"},
              body: JSON.stringify({state: "retired"})})).status""",
        [ids["gpu-node-03"]],
    )
    assert status == 403
    viewer.goto(f"{url}/gpus/{gpu}/")
    assert "gpu-node-04" in viewer.inner_text("#gpu-claim")
    assert viewer.locator("#reassign-gpu").count() == 0
    shot(viewer, "14-gpu-claimed-viewer")
    assert viewer.errors == []
    viewer.context.close()

    admin = page_as(browser, live, "admin")
    admin.on("dialog", lambda dialog: dialog.accept())  # Retire asks first
    # Reassign the claimed GPU to the node that claims it (it moved between hosts).
    admin.goto(f"{url}/gpus/{gpu}/")
    shot(admin, "14-gpu-claimed-admin")
    assert admin.input_value('#reassign-gpu select[name="node"]') == str(ids["gpu-node-04"])
    admin.fill('#reassign-gpu input[name="reason"]', "moved to gpu-node-04")
    admin.click("#reassign-gpu button[type=submit]")
    admin.wait_for_selector("#reassign-gpu .notice.ok")
    admin.wait_for_selector("#gpu-claim", state="detached")  # reloaded: no claim left
    data = admin.evaluate(f"async () => (await fetch('/api/gpus/{gpu}/')).json()")
    assert (data["node"], data["claimed_by"]) == (ids["gpu-node-04"], None)
    resp = agents["gpu-node-04"].post("/api/agents/report/", json={**squat, "seq": 2})
    assert resp.json()["gpus_refused"] == [], resp.text  # its own GPU now
    # Retire node 03: its agent is cut off.
    node3 = ids["gpu-node-03"]
    admin.goto(f"{url}/nodes/{node3}/")
    shot(admin, "15-node-admin")
    admin.click("#retire-node button[type=submit]")
    admin.wait_for_selector("#retire-node .notice.ok")
    admin.wait_for_selector("h1 .state-retired")  # reloaded, retired
    assert admin.locator("#retire-node").count() == 0  # nothing left to retire
    shot(admin, "16-node-retired")
    assert admin.evaluate(f"async () => (await fetch('/api/nodes/{node3}/')).json()")["state"] == (
        "retired"
    )
    assert agents["gpu-node-03"].post("/api/agents/heartbeat/", json={}).status_code == 401
    # Allow node 04 to re-enrol: a fleet token without the node's proof is refused until then.
    enrol = {"enrolment_token": fleet, "hostname": "gpu-node-04"}
    refused = anon.post("/api/agents/enrol/", json=enrol)
    assert refused.status_code == 403 and refused.json()["error"] == "node_name_taken"
    admin.goto(f"{url}/nodes/{ids['gpu-node-04']}/")
    admin.click("#allow-reenrolment button[type=submit]")
    admin.wait_for_selector("#allow-reenrolment .notice.ok")
    admin.wait_for_selector("#reenrol-allowed")  # reloaded: the approval and until when
    shot(admin, "17-node-reenrolment-allowed")
    assert anon.post("/api/agents/enrol/", json=enrol).status_code == 201
    assert agents["gpu-node-04"].post("/api/agents/heartbeat/", json={}).status_code == 401
    assert admin.errors == []
    admin.context.close()
