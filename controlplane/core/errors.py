"""Domain errors: a refusal a caller can act on, raised by services, tasks and commands.

Standard library only, so workers, management commands and pure logic raise the same errors as
the API. Each carries a machine-readable ``code``, the ``field`` at fault (or None) and the HTTP
``status`` it answers with; the API's one exception handler (``controlplane.api.exceptions``)
turns it into ``{"error": code, "detail": detail, "field": field}``. The status is a property of
the error where it is raised, never guessed from the wording of its message.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A refused request: nothing was changed. Subclasses fix the status and a default code."""

    status = 400
    code = "invalid"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        field: str | None = None,
        status: int | None = None,
        **extra: Any,
    ):
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.field = field
        if status is not None:
            self.status = status
        self.extra = extra  # further keys of the response body (e.g. an expected value)

    def body(self) -> dict[str, Any]:
        """The response body the API sends for this error."""
        return {"error": self.code, "detail": self.detail, "field": self.field, **self.extra}


class Invalid(DomainError):
    """Bad input (400)."""


class Forbidden(DomainError):
    """The caller may not do this to this object (403)."""

    status = 403
    code = "forbidden"


class Conflict(DomainError):
    """The object's current state does not allow this (409)."""

    status = 409
    code = "conflict"
