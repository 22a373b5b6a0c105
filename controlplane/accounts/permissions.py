"""One permission class for every API view: roles for people, kinds for tokens.

A view declares:
  token_kinds = {"agent"} / {"gateway"} / set()   which machine tokens it accepts (default none)
  read_role / write_role                           the least role for safe / unsafe methods
  action_roles = {"approve": "operator"}           per viewset action, overrides the above
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from .choices import Role, TokenKind
from .models import ApiToken
from .roles import has_role


class RolePermission(BasePermission):
    message = "your role does not allow this"

    def has_permission(self, request, view) -> bool:
        token = request.auth if isinstance(request.auth, ApiToken) else None
        if token is not None and token.kind != TokenKind.USER:
            return token.kind in getattr(view, "token_kinds", set())
        if getattr(view, "token_kinds_only", False):
            return False
        action = getattr(view, "action", None)
        needed = getattr(view, "action_roles", {}).get(action)
        if needed is None:
            safe = request.method in SAFE_METHODS
            needed = getattr(
                view, "read_role" if safe else "write_role", Role.VIEWER if safe else Role.ADMIN
            )
        return has_role(request.user, needed)
