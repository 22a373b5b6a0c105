"""Print an agent enrolment token (for provisioning agents without the dashboard): one-time by
default, a bounded fleet token with ``--max-uses N``."""

import json

from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.services import issue_enrolment_token


class Command(BaseCommand):
    help = "Create an expiring enrolment token (single-use unless --max-uses) and print it once."

    def add_arguments(self, parser):
        parser.add_argument("--ttl", type=int, default=None, help="seconds until it expires")
        parser.add_argument("--labels", default="{}", help='JSON object, e.g. {"zone": "a"}')
        parser.add_argument(
            "--max-uses", type=int, default=1, help="agents it may enrol (a fleet token: > 1)"
        )
        parser.add_argument(
            "--node",
            default="",
            help="bind it to this node name: it enrols only that name, and may re-enrol it "
            "(a reinstalled host whose agent lost its state)",
        )

    def handle(self, ttl, labels, max_uses, node, **opts):
        labels = parse_labels(labels)
        if max_uses < 1:
            raise CommandError("--max-uses must be at least 1")
        _, raw = issue_enrolment_token(
            None,
            ttl,
            labels=labels,
            max_uses=max_uses,
            node_name=node,
            reason="manage.py create_enrolment_token",
        )
        self.stdout.write(raw)


def parse_labels(text: str) -> dict:
    try:
        labels = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--labels is not JSON: {exc}") from None
    if not isinstance(labels, dict):
        raise CommandError("--labels must be a JSON object")
    return labels
