"""The JSON-over-HTTP client the executors that drive an outside service share (the LMCache
controller, the LMCache coordinator): one place that turns a refusal, an error status, an
unanswered call or a body that is not JSON into the executor's own error with one clear line."""

from __future__ import annotations

from typing import Any

import httpx


class ServiceError(Exception):
    """The service refused, failed or could not be reached; the message says which."""


class JsonService:
    """``call(method, path, body)`` against ``url``; raises ``error`` (a ``ServiceError``)."""

    what = "service"  # how messages name it, e.g. "LMCache controller"
    error: type[ServiceError] = ServiceError

    def __init__(
        self, url: str, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None
    ):
        self.url = url.rstrip("/")
        self.client = httpx.Client(timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self.client.close()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = self.client.request(method, self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise self.error(
                f"{self.what} {self.url} did not answer {path}: {type(exc).__name__}: {exc}"
            ) from None
        if resp.status_code != 200:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise self.error(
                f"{self.what} {self.url}{path}: HTTP {resp.status_code}: {str(detail)[:300]}"
            )
        try:
            return resp.json()
        except ValueError:
            raise self.error(f"{self.what} {self.url}{path}: not JSON: {resp.text[:200]}") from None
