"""Roles and token kinds (the kinds' values from ``controlplane.core.protocol``)."""

from controlplane.choiceset import ChoiceSet
from controlplane.core import protocol as wire


class Role:
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    ALL = (VIEWER, OPERATOR, ADMIN)
    RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}


class TokenKind(ChoiceSet):
    USER = wire.TOKEN_USER, "User (automation, acts as its user)"
    GATEWAY = wire.TOKEN_GATEWAY, "Gateway (request records only)"
    AGENT = wire.TOKEN_AGENT, "Agent (its own node only)"
    PREFIX = {USER: "pwu_", GATEWAY: "pwg_", AGENT: "pwa_"}
