"""Which role a user has: the highest of their groups; superusers are admins."""

from __future__ import annotations

from .choices import Role


def role_of(user) -> str | None:
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return None
    if user.is_superuser:
        return Role.ADMIN
    names = {g.name for g in user.groups.all()}
    for role in (Role.ADMIN, Role.OPERATOR, Role.VIEWER):
        if role in names:
            return role
    return None


def has_role(user, needed: str) -> bool:
    role = role_of(user)
    return role is not None and Role.RANK[role] >= Role.RANK[needed]
