"""Request size checks done before a body is parsed."""

from django.conf import settings
from rest_framework import status

from .exceptions import ApiError


def check_body_size(request, limit: int | None = None) -> None:
    limit = limit or settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError("bad_content_length", "Content-Length is not a number") from None
    if length > limit:
        raise ApiError(
            "too_large",
            f"body of {length} bytes exceeds the limit of {limit}",
            status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
