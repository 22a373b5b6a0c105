"""Dashboard pages per role: who may see what, CSRF on every form, nothing inline for the CSP."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from controlplane.core.policy import knobs
from controlplane.fleet.models import Engine, Gpu
from controlplane.replication.models import PlanItem, Policy, ReplicationPlan
from harness import fleet_seed as cluster

PAGES = [
    "/",
    "/forecasts/",
    "/plans/",
    "/jobs/",
    "/policies/",
    "/overrides/",
    "/scoreboard/",
    "/misses/",
    "/doctor/",
]
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", re.I)
POST_FORM = re.compile(r"<form[^>]*method=\"post\"[^>]*>(.*?)</form>", re.S | re.I)


@pytest.fixture
def world(db):
    from rest_framework.test import APIClient

    _, raw = cluster.enrol("node-a")
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    keys = cluster.chain(1, 3)
    cluster.hot_prefix("acme", keys, 10)
    agent.post(
        "/api/agents/report/",
        cluster.report(1, "node-a", engines=2, mode="snapshot"),
        format="json",
    )
    policy = Policy.objects.get(active=True)  # the migration installs one
    Policy.objects.filter(pk=policy.pk).update(mode="manual")
    plan = ReplicationPlan.objects.create(policy=policy, mode="manual")
    engine = Engine.objects.first()
    PlanItem.objects.create(
        plan=plan,
        prefix_keys=keys,
        target=engine,
        bytes=1,
        expected_ttft_saved_s=1.0,
        cost_s=0.1,
        confidence=0.9,
        reason="burst forecast for acme",
    )
    return {"plan": plan, "engine": engine, "gpu": Gpu.objects.first(), "node": engine.node}


def signed_in(role):
    client = Client()
    client.force_login(cluster.make_user(role))
    return client


def all_pages(world):
    return PAGES + [
        f"/plans/{world['plan'].pk}/",
        f"/nodes/{world['node'].pk}/",
        f"/gpus/{world['gpu'].pk}/",
        f"/engines/{world['engine'].pk}/",
        "/audit/",
    ]


def test_anonymous_is_sent_to_sign_in(world):
    for url in all_pages(world):
        resp = Client().get(url)
        assert resp.status_code == 302 and resp.url.startswith("/login/"), url


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_every_page_renders_for_every_role_without_inline_scripts(world, role):
    client = signed_in(role)
    for url in all_pages(world):
        resp = client.get(url)
        if url == "/audit/" and role == "viewer":
            assert resp.status_code == 403  # the audit API is operator-only too
            continue
        assert resp.status_code == 200, (url, resp.status_code)
        html = resp.content.decode()
        assert not INLINE_SCRIPT.search(html), url
        for form in POST_FORM.findall(html):
            assert "csrfmiddlewaretoken" in form, url
        assert f'id="role">{role}<' in html


def test_user_without_a_role_is_refused(world):
    assert signed_in(None).get("/").status_code == 403


def test_plan_buttons_only_for_operators(world):
    url = f"/plans/{world['plan'].pk}/"
    viewer = signed_in("viewer").get(url).content.decode()
    assert "data-approve" not in viewer and "operators and admins approve" in viewer
    operator = signed_in("operator").get(url).content.decode()
    assert 'data-approve="1"' in operator and "burst forecast for acme" in operator


def test_policy_forms_only_for_admins(world):
    assert (
        'data-api="/api/policies/' not in signed_in("operator").get("/policies/").content.decode()
    )
    assert (
        f'data-api="/api/policies/{Policy.objects.get(active=True).pk}/"'
        in signed_in("admin").get("/policies/").content.decode()
    )
    assert 'data-api="/api/overrides/"' in signed_in("operator").get("/overrides/").content.decode()
    assert (
        'data-api="/api/overrides/"' not in signed_in("viewer").get("/overrides/").content.decode()
    )


def test_the_policy_form_sends_the_apis_names_with_the_policys_values(world):
    """Each knob's input is named as the REST API names it (``horizon_seconds``) and shows the
    policy's value (the model's ``horizon_s``)."""
    policy = Policy.objects.get(active=True)
    Policy.objects.filter(pk=policy.pk).update(horizon_s=123, max_cluster_queue_s=None)
    policy.refresh_from_db()
    page = signed_in("admin").get("/policies/").content.decode()
    form = page[page.index(f'data-api="/api/policies/{policy.pk}/"') :].split("</form>")[0]
    for knob in knobs.KNOBS:
        if knob.field == "holdout_fraction":  # set through the API and the admin, not this form
            continue
        value = getattr(policy, knob.field)
        shown = "" if value is None else str(value)
        assert f'name="{knob.api}"' in form, knob.api
        assert re.search(rf'name="{knob.api}"[^>]*value="{re.escape(shown)}"', form), knob.api


def test_assets_and_bundled_plotly_are_served(db):
    client = signed_in("viewer")
    resp = client.get("/ui/plotly.min.js")
    assert resp.status_code == 200 and resp["Content-Type"] == "text/javascript"
    assert b"plotly" in b"".join(resp.streaming_content)[:2000].lower()
    assert client.get("/ui/cachemap.js").status_code == 200
    assert client.get("/ui/../views.py").status_code in (400, 404)  # no way out of the folder


def test_sign_in_and_out(db):
    cluster.make_user("viewer", "vera")
    client = Client(enforce_csrf_checks=True)
    page = client.get("/login/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    resp = client.post(
        "/login/", {"username": "vera", "password": cluster.PASSWORD, "csrfmiddlewaretoken": token}
    )
    assert resp.status_code == 302 and resp.url == "/"
    assert client.get("/").status_code == 200
    assert client.post("/logout/").status_code == 403  # no CSRF token: refused
    home = client.get("/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', home).group(1)
    assert client.post("/logout/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert client.get("/").status_code == 302


def test_forecast_page_shows_actual_and_band(world):
    from controlplane.demand.models import WorkloadKey
    from controlplane.forecasting.models import Forecast

    key = WorkloadKey.objects.get()
    Forecast.objects.create(
        key=key,
        start=timezone.now() + timedelta(minutes=1),
        bucket_s=60,
        horizon=3,
        yhat=[5, 6, 7],
        lower=[4, 5, 6],
        upper=[6, 7, 8],
        model="ewma",
        backtest_mase=0.83,
        scores={"ewma": 0.83, "last_value": 1.1},
    )
    html = signed_in("viewer").get(f"/forecasts/?key={key.pk}").content.decode()
    assert "0.830" in html and "(chosen)" in html and '"yhat": [5, 6, 7]' in html


def test_paging_keeps_the_filter(world):
    from controlplane.replication.models import ReplicationJob

    for _ in range(60):
        ReplicationJob.objects.create(
            target=world["engine"], prefix_keys=["01"], bytes=1, state="failed"
        )
    html = signed_in("viewer").get("/jobs/?state=failed").content.decode()
    assert "?page=2&amp;state=failed" in html


def test_cache_map_header_has_the_figures_on_first_paint(world):
    page = signed_in("viewer").get("/").content.decode()
    figures = dict(re.findall(r'data-stat="(\w+)">([^<]*)<', page))
    # node-a active with 2 engines; the world's one plan is proposed (open); no jobs yet.
    assert figures == {
        "nodes": "1",
        "stale": "0",
        "engines": "2",
        "plans": "1",
        "jobs": "0",
        "updated": "–",
    }


def test_api_docs_are_served_whole_by_the_control_plane(db):
    client = Client()
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert not INLINE_SCRIPT.search(html)  # the CSP allows no inline script
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith("/") for a in assets), assets  # no CDN
    for url in assets:
        resp = client.get(url)
        assert resp.status_code == 200, url
        if url.endswith(".js") or "script" in url:
            assert "javascript" in resp["Content-Type"], url
    assert client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/nope.js").status_code == 404
