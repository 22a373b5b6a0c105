"""Register the fleet enrolment token a deployment generated (the Helm chart's Secret), so agents
of a DaemonSet or of sidecars enrol with it without a token made by hand per pod.

The raw token comes from the environment (``PREWARM_FLEET_ENROLMENT_TOKEN``), never from the
command line, where any process listing would show it. Running it again (every upgrade) keeps the
token's uses so far and sets its bound and expiry to the ones given.
"""

import os

from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.services import ensure_fleet_enrolment_token

from .create_enrolment_token import parse_labels

ENV = "PREWARM_FLEET_ENROLMENT_TOKEN"


class Command(BaseCommand):
    help = f"Register (or renew) the fleet enrolment token held in ${ENV}."

    def add_arguments(self, parser):
        parser.add_argument("--max-uses", type=int, required=True, help="agents it may enrol")
        parser.add_argument("--ttl", type=int, required=True, help="seconds until it expires")
        parser.add_argument("--labels", default="{}", help='JSON object, e.g. {"zone": "a"}')

    def handle(self, max_uses, ttl, labels, **opts):
        raw = os.environ.get(ENV, "")
        if not raw:
            raise CommandError(f"environment variable {ENV} is required but not set")
        if max_uses < 1 or ttl < 60:
            raise CommandError("--max-uses must be at least 1 and --ttl at least 60 seconds")
        try:
            token, created = ensure_fleet_enrolment_token(
                None,
                raw,
                ttl,
                max_uses=max_uses,
                labels=parse_labels(labels),
                reason="manage.py ensure_fleet_enrolment_token",
            )
        except ValueError as exc:
            raise CommandError(f"{ENV}: {exc}") from None
        verb = "registered" if created else "renewed"
        self.stdout.write(
            f"fleet enrolment token {token.prefix}… {verb}: {token.uses} of {token.max_uses} "
            f"uses, expires {token.expires_at.isoformat()}"
        )
