"""Create or update a replication policy and make it the active one (used by `make demo`)."""

import json

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from controlplane.replication.api.serializers import PolicySerializer
from controlplane.replication.models import Policy
from controlplane.replication.services import activate_policy


class Command(BaseCommand):
    help = "Create or update a policy from JSON fields (validated as the API does) and activate it."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--fields", default="{}", help='JSON, e.g. {"mode": "auto", "plan_every_seconds": 10}'
        )

    @transaction.atomic
    def handle(self, name, fields, **opts):
        try:
            data = json.loads(fields)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--fields is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise CommandError("--fields must be a JSON object")
        policy = Policy.objects.filter(name=name).first()
        ser = PolicySerializer(
            policy, data={**data, "name": name, "active": True}, partial=policy is not None
        )
        if not ser.is_valid():
            raise CommandError(f"invalid policy: {json.dumps(ser.errors)}")
        saved = policy or Policy()
        for field, value in ser.validated_data.items():
            setattr(saved, field, value)
        activate_policy(saved, None, reason="manage.py ensure_policy")  # deactivates the others
        self.stdout.write(
            f"{'updated' if policy else 'created'} policy {name} ({saved.mode}), active"
        )
