"""Every API error as {"error", "detail", "field"} with a 4xx (or 503) status: the one exception
handler.

Services raise ``controlplane.core.errors.DomainError`` (code, field and status, no DRF); views
may still raise ``ApiError``, the same thing shaped as a DRF exception. Both map here."""

from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler
from rest_framework.views import set_rollback

from controlplane.core.errors import DomainError


class ApiError(exceptions.APIException):
    """A 4xx (or a 503) with a machine-readable code and the field at fault; ``retry_after_s``
    adds a ``Retry-After`` header."""

    def __init__(
        self,
        code: str,
        detail: str,
        field: str | None = None,
        status_code: int = status.HTTP_400_BAD_REQUEST,
        retry_after_s: int | None = None,
        **extra,
    ):
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.error_code = code
        self.field = field
        self.retry_after_s = retry_after_s
        self.extra = extra


def _first_field_error(data, path=""):
    """The first (field path, message) of a DRF validation error tree."""
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
                sub = f"{path}[{key}]"  # DRF keys list items by index
            else:
                sub = f"{path}.{key}" if path else str(key)
            if key == "non_field_errors":
                sub = path or None
            return _first_field_error(value, sub)
    if isinstance(data, list) and data:
        if all(isinstance(x, (str, exceptions.ErrorDetail)) for x in data):
            return path or None, str(data[0])
        for i, item in enumerate(data):
            if item:
                return _first_field_error(item, f"{path}[{i}]")
    return path or None, str(data)


def exception_handler(exc, context):
    if isinstance(exc, ApiError):
        # A refused request changes nothing, even what the view wrote before it refused.
        set_rollback()
        body = {"error": exc.error_code, "detail": str(exc.detail), "field": exc.field, **exc.extra}
        wait = exc.retry_after_s
        return Response(
            body, status=exc.status_code, headers={"Retry-After": str(wait)} if wait else None
        )
    if isinstance(exc, DomainError):
        set_rollback()
        return Response(exc.body(), status=exc.status)
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_field_error(response.data)
        response.data = {
            "error": "invalid",
            "detail": message,
            "field": field,
            "errors": response.data,
        }
    else:
        code = getattr(exc, "default_code", "error")
        detail = (
            response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        )
        response.data = {"error": code, "detail": str(detail), "field": None}
    return response
