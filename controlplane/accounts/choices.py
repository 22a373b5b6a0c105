"""Roles and token kinds."""


class Role:
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    ALL = (VIEWER, OPERATOR, ADMIN)
    RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}


class TokenKind:
    USER = "user"
    GATEWAY = "gateway"
    AGENT = "agent"
    CHOICES = [
        (USER, "User (automation, acts as its user)"),
        (GATEWAY, "Gateway (request records only)"),
        (AGENT, "Agent (its own node only)"),
    ]
    PREFIX = {USER: "pwu_", GATEWAY: "pwg_", AGENT: "pwa_"}
