"""The API's paging: limit/offset, bounded so that no query parameter overflows the database."""

from rest_framework.pagination import LimitOffsetPagination

MAX_OFFSET = 2**62  # PostgreSQL's OFFSET is a bigint: ?offset=1e22 was a 500 under fuzzing


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """LimitOffsetPagination with a largest page and a largest offset."""

    max_limit = 1000  # ?limit=40829804512897751056384 was a 500 (bigint out of range)

    def get_offset(self, request):
        return min(super().get_offset(request), MAX_OFFSET)
