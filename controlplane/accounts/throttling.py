"""Rate limits per token, not per address: agents and gateways behind one NAT (or all on one
host in tests) must not share one budget, and one leaked token must not spend everyone's."""

from rest_framework.throttling import ScopedRateThrottle

from .models import ApiToken


class TokenScopedRateThrottle(ScopedRateThrottle):
    def get_cache_key(self, request, view):
        if isinstance(request.auth, ApiToken):
            return self.cache_format % {"scope": self.scope, "ident": f"token-{request.auth.pk}"}
        return super().get_cache_key(request, view)
