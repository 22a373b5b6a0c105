"""Views that are their service's transaction, not one transaction per request."""

from __future__ import annotations

from django.db import connections


class OwnTransaction:
    """For views that are not one transaction per request (``non_atomic_requests``): their
    service is the transaction, and a refusal rolled it back already."""

    def get_exception_handler(self):
        handler = super().get_exception_handler()

        def refuse(exc, context):
            # The API's handler marks the innermost open transaction for rollback, which here
            # is never this request's, but may be an enclosing one (a test's): leave those as
            # they were.
            marks = {c.alias: c.get_rollback() for c in connections.all() if c.in_atomic_block}
            response = handler(exc, context)
            for alias, mark in marks.items():
                connections[alias].set_rollback(mark)
            return response

        return refuse
