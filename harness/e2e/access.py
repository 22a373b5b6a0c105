"""The end-to-end cluster's control plane as a test or a bench reaches it: ``manage.py``, the REST
API with the admin's (or a given) token, the gateway's records, a policy, a browser's session."""

from __future__ import annotations

import re
import time

import httpx

from harness import burst
from harness.e2e.settings import PASSWORD
from harness.processes import manage


class ControlPlaneAccess:
    """Mixed into ``Cluster``: it sets ``url``, ``env``, ``admin_token`` and ``gateway_token``."""

    url: str
    env: dict[str, str]
    admin_token: str
    gateway_token: str

    def manage(self, *args: str) -> str:
        out = manage(self.env, *args).strip()
        return out.splitlines()[-1] if out else ""

    def shell(self, code: str) -> str:
        return self.manage("shell", "--no-imports", "-c", code)

    def api(self, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kw)

    def get(self, path: str) -> dict | list:
        resp = self.api("GET", path)
        resp.raise_for_status()
        return resp.json()

    def results(self, path: str) -> list[dict]:
        data = self.get(path)
        return data["results"] if isinstance(data, dict) and "results" in data else data

    def engines(self) -> dict[str, dict]:
        try:
            return {
                e["endpoints"]["transfer"]: e for e in self.results("/api/engines/?page_size=500")
            }
        except httpx.HTTPError:
            return {}

    def post_records(self, records: list[dict]) -> dict:
        resp = self.api(
            "POST", "/api/request-records/", self.gateway_token, json={"records": records}
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    def post_burst(self) -> dict:
        """The recorded burst, ending just before the current demand bucket (never near its end,
        where the forecast could run in the next, empty bucket)."""
        if time.time() % 60 > 45:
            time.sleep(61 - time.time() % 60)
        return self.post_records(burst.records(time.time()))

    def activate_policy(self, mode: str = "auto", **kw) -> dict:
        data = {
            "name": f"e2e-{mode}",
            "active": True,
            "mode": mode,
            "min_confidence": 0.0,
            "horizon_seconds": 300,
            "replica_ttl_seconds": 3600,
            **kw,
        }
        resp = self.api("POST", "/api/policies/", json=data)
        assert resp.status_code == 201, resp.text
        return resp.json()

    def login_cookie(self) -> str:
        """A browser's session: the login form, CSRF token and all."""
        with httpx.Client(base_url=self.url, timeout=10) as c:
            page = c.get("/login/")
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
            resp = c.post(
                "/login/",
                data={"username": "ops", "password": PASSWORD, "csrfmiddlewaretoken": csrf},
                headers={"Referer": f"{self.url}/login/"},
            )
            assert resp.status_code in (200, 302), resp.text[:500]
            return f"sessionid={c.cookies['sessionid']}"
