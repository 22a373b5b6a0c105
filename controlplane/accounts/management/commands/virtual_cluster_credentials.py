"""Credentials for a virtual cluster (`prewarm-sim cluster`): a gateway token, an operator's
user token and one enrolment token per agent, written as JSON (mode 0600) or printed."""

import json
import os
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.choices import Role, TokenKind
from controlplane.accounts.services import issue_api_token, issue_enrolment_token

USER = "virtual-cluster"


class Command(BaseCommand):
    help = "Issue the tokens a virtual cluster needs and write them as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--agents", type=int, required=True)
        parser.add_argument("--out", help="file to write (default: print)")
        parser.add_argument("--ttl", type=int, default=3600, help="enrolment tokens expire after")

    def handle(self, agents, out, ttl, **opts):
        if not 1 <= agents <= 1000:
            raise CommandError("--agents must be between 1 and 1000")
        if out and Path(out).exists():
            self.stdout.write(f"{out} exists: keeping it")  # a restarted bootstrap issues nothing
            return
        user, _ = get_user_model().objects.get_or_create(username=USER)
        user.set_unusable_password()  # it signs in with its token only
        user.save()
        user.groups.set([Group.objects.get(name=Role.OPERATOR)])
        why = "manage.py virtual_cluster_credentials"
        _, gw_raw = issue_api_token(None, TokenKind.GATEWAY, USER, reason=why)
        _, op_raw = issue_api_token(None, TokenKind.USER, USER, user=user, reason=why)
        enrol = [
            issue_enrolment_token(None, ttl, labels={"virtual": "true"}, reason=why)[1]
            for _ in range(agents)
        ]
        doc = json.dumps(
            {"gateway_token": gw_raw, "operator_token": op_raw, "enrolment_tokens": enrol}
        )
        if not out:
            self.stdout.write(doc)
            return
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(doc)
        self.stdout.write(f"wrote {path}")
