"""Production settings: secrets only from the environment, `check --deploy` clean, secure cookies."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each case starts a Django process


def production_env(tmp_path, **overrides) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "SECRET_KEY",
            "DEBUG",
            "PREWARM_SECURE",
            "CELERY_TASK_ALWAYS_EAGER",
            "ALLOWED_HOSTS",
        }
    }
    env.update(
        {
            # Never connected to: `check --deploy` inspects settings only.
            "DATABASE_URL": "postgres://prewarm:pw@127.0.0.1:1/prewarm",
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "SECRET_KEY": secrets.token_urlsafe(60),
            "ALLOWED_HOSTS": "prewarm.example.com",
            "PREWARM_DATA_DIR": str(tmp_path),
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        }
    )
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def manage(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_under_production_settings(tmp_path):
    out = manage(production_env(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout


def test_check_deploy_catches_debug_in_production(tmp_path):
    # The same command fails when a deployment gets a setting wrong: the check can fail.
    out = manage(
        production_env(tmp_path, DEBUG="true"), "check", "--deploy", "--fail-level", "WARNING"
    )
    assert out.returncode != 0 and "DEBUG" in out.stderr + out.stdout


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS"])
def test_production_refuses_to_start_without_a_secret_from_the_environment(tmp_path, missing):
    out = manage(production_env(tmp_path, **{missing: None}), "check")
    assert out.returncode != 0
    assert f"environment variable {missing} is required" in out.stderr


def test_a_short_secret_key_is_refused(tmp_path):
    out = manage(production_env(tmp_path, SECRET_KEY="short"), "check")
    assert out.returncode != 0 and "SECRET_KEY is malformed" in out.stderr


def test_production_cookies_and_hsts(tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_HTTPONLY, s.DEBUG)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=production_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split() == ["True", "True", "31536000", "True", "False"], out.stderr


def test_no_secret_literal_in_settings():
    # Secrets come from the environment (or, embedded only, a generated per-install file).
    text = "\n".join(p.read_text() for p in (REPO / "controlplane" / "settings").glob("*.py"))
    assert not re.search(r"(SECRET_KEY|PASSWORD|TOKEN)\s*=\s*[\"'][^\"']{8,}", text)
