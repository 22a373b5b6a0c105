"""Shared fixtures: users per role, API clients, enrolled agents, gateway tokens. The run's rules
(a skip fails `make test` and CI; PREWARM_TEST_WITHOUT) are the plugin tests/run_rules.py."""

import pytest

pytest_plugins = ["tests.run_rules"]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_random_holdout(request, settings):
    """Policies without their own holdout_fraction hold out nothing, so that which items get
    copied is not random in tests about something else; a test marked ``holdout_default`` runs
    with the deployment default (PREWARM_HOLDOUT_FRACTION, 0.15), and
    ``tests/workflow/test_evidence.py`` checks that default is what such a policy draws."""
    if request.node.get_closest_marker("holdout_default") is None:
        settings.PREWARM_HOLDOUT_FRACTION = 0.0


@pytest.fixture(autouse=True)
def _fresh_residency_index(settings):
    """Every test starts with an empty residency index (in-process or Redis)."""
    try:
        from controlplane.fleet.configured_index import get_index, reset_index
    except Exception:  # Django not configured for pure-logic tests
        yield
        return
    reset_index()
    get_index().clear()
    from controlplane.forecasting.services.window import reset_windows

    reset_windows()  # a test's database is rolled back: its key ids come round again
    yield
    get_index().clear()
    reset_index()
