"""Print a new API token: a gateway's, or a user's (acts with that user's role)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.choices import TokenKind
from controlplane.accounts.models import ApiToken
from controlplane.audit.services import record


class Command(BaseCommand):
    help = "Create an API token (gateway, or user with --user) and print it once."

    def add_arguments(self, parser):
        parser.add_argument("--kind", choices=[TokenKind.GATEWAY, TokenKind.USER], required=True)
        parser.add_argument("--name", required=True)
        parser.add_argument("--user", help="the user a user token acts as")

    def handle(self, kind, name, user, **opts):
        owner = None
        if kind == TokenKind.USER:
            if not user:
                raise CommandError("a user token needs --user")
            owner = get_user_model().objects.filter(username=user).first()
            if owner is None:
                raise CommandError(f"no user {user!r}")
        elif user:
            raise CommandError("--user applies to user tokens only")
        token, raw = ApiToken.issue(kind, name, user=owner)
        record(None, "token.created", token, after={"kind": kind, "name": name, "prefix": token.prefix,
                                                     "via": "manage.py"})
        self.stdout.write(raw)
