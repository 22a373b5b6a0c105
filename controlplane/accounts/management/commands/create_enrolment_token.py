"""Print a one-time agent enrolment token (for provisioning agents without the dashboard)."""

import json

from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.services import issue_enrolment_token


class Command(BaseCommand):
    help = "Create a single-use, expiring enrolment token and print it once."

    def add_arguments(self, parser):
        parser.add_argument("--ttl", type=int, default=None, help="seconds until it expires")
        parser.add_argument("--labels", default="{}", help='JSON object, e.g. {"zone": "a"}')

    def handle(self, ttl, labels, **opts):
        try:
            labels = json.loads(labels)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--labels is not JSON: {exc}") from None
        if not isinstance(labels, dict):
            raise CommandError("--labels must be a JSON object")
        _, raw = issue_enrolment_token(
            None, ttl, labels=labels, reason="manage.py create_enrolment_token"
        )
        self.stdout.write(raw)
