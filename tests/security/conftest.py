"""Shared fixtures for the security tests (the API tests' clients and enrolment)."""

from tests.api.conftest import client_for, enrol, gateway  # noqa: F401 - fixtures
