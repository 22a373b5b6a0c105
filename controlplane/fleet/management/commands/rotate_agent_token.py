"""Revoke every agent token of a node and print a new one (a leaked token, a rebuilt host)."""

from django.core.management.base import BaseCommand, CommandError

from controlplane.fleet.models import Node
from controlplane.fleet.services import rotate_agent_token


class Command(BaseCommand):
    help = "Revoke a node's agent tokens and print a new one, once."

    def add_arguments(self, parser):
        parser.add_argument("node", help="the node's name (its hostname at enrolment)")

    def handle(self, node, **opts):
        found = Node.objects.filter(name=node).first()
        if found is None:
            raise CommandError(f"no node named {node!r}")
        self.stdout.write(rotate_agent_token(found, None))
