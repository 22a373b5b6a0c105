"""Create or update a user with a role (used by `make demo` and deployments)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.choices import Role, TokenKind
from controlplane.accounts.services import issue_api_token


class Command(BaseCommand):
    help = "Create or update a user in a role group (viewer, operator, admin)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", required=True)
        parser.add_argument("--role", choices=Role.ALL, default=Role.VIEWER)
        parser.add_argument(
            "--issue-token",
            metavar="NAME",
            default="",
            help="also issue a pwu_ token acting as this user (printed once), e.g. "
            "for Prometheus scraping /api/metrics/ as a viewer",
        )

    def handle(self, username, password, role, issue_token="", **opts):
        if len(password) < 8:
            raise CommandError("password must have at least 8 characters")
        User = get_user_model()
        user, created = User.objects.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = role == Role.ADMIN
        user.is_superuser = role == Role.ADMIN
        user.save()
        user.groups.set([Group.objects.get(name=role)])
        self.stdout.write(f"{'created' if created else 'updated'} {username} ({role})")
        if issue_token:
            _, raw = issue_api_token(
                None,
                TokenKind.USER,
                issue_token,
                user=user,
                reason="manage.py ensure_user --issue-token",
            )
            self.stdout.write(raw)
