"""Roles and token kinds (the kinds' values from ``wire.protocol``)."""

from controlplane.choiceset import ChoiceSet
from wire import protocol


class Role:
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    ALL = (VIEWER, OPERATOR, ADMIN)
    RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}


class TokenKind(ChoiceSet):
    USER = protocol.TOKEN_USER, "User (automation, acts as its user)"
    GATEWAY = protocol.TOKEN_GATEWAY, "Gateway (request records only)"
    AGENT = protocol.TOKEN_AGENT, "Agent (its own node only)"
    PREFIX = {USER: "pwu_", GATEWAY: "pwg_", AGENT: "pwa_"}
