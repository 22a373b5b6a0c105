"""Filter fields shared by the API's FilterSets."""

from datetime import UTC, datetime

from django import forms
from django_filters import rest_framework as filters

# Dates outside this range overflow PostgreSQL's timestamptz once shifted to UTC (a fuzzed
# "0001-01-01T00:00+14:00" is year 0): refuse them as bad input instead of failing with a 500.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def in_range(value: datetime) -> bool:
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        return EARLIEST <= aware <= LATEST
    except OverflowError:
        return False


class BoundedIsoDateTimeField(forms.DateTimeField):
    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is not None and not in_range(parsed):
            raise forms.ValidationError("date-time out of range (1970-9000)")
        # The instant in UTC: Python accepts offsets up to 24 h, PostgreSQL only up to 15:59
        # ("2290-07-25T06:57-20:08" was a 500 under fuzzing).
        return parsed.astimezone(UTC) if parsed is not None and parsed.tzinfo else parsed


class BoundedIsoDateTimeFilter(filters.IsoDateTimeFilter):
    """An ISO 8601 date-time filter that refuses dates the database cannot store."""

    field_class = BoundedIsoDateTimeField
