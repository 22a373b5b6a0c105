"""Roles and token kinds (the kinds' values from ``controlplane.core.protocol``)."""

from controlplane.core import protocol as wire


class Role:
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    ALL = (VIEWER, OPERATOR, ADMIN)
    RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}


class TokenKind:
    USER = wire.TOKEN_USER
    GATEWAY = wire.TOKEN_GATEWAY
    AGENT = wire.TOKEN_AGENT
    CHOICES = [
        (USER, "User (automation, acts as its user)"),
        (GATEWAY, "Gateway (request records only)"),
        (AGENT, "Agent (its own node only)"),
    ]
    PREFIX = {USER: "pwu_", GATEWAY: "pwg_", AGENT: "pwa_"}
