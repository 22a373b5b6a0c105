"""OpenAPI extensions: the bearer-token schemes (any token; agents' views: agent tokens)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.accounts.authentication.ApiTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "pwu_ (user), pwg_ (gateway) or pwa_ (agent) token",
        }


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.accounts.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "pwa_ (agent) token"}
