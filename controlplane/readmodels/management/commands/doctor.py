"""``manage.py doctor``: the fleet doctor's findings, one per line with the setting to change;
exit status 0 when healthy, 1 with findings (for scripts and CI checks)."""

import json
import sys

from django.core.management.base import BaseCommand

from controlplane.readmodels.doctor import report


class Command(BaseCommand):
    help = "Check the fleet for what makes KV-aware routing wrong; exit 1 with findings."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="the API's JSON instead of text")

    def handle(self, *args, **opts):
        got = report()
        if opts["json"]:
            self.stdout.write(json.dumps(got, indent=2))
        elif got["healthy"]:
            self.stdout.write("healthy: no finding")
        else:
            for f in got["findings"]:
                self.stdout.write(f"{f['check']} [{f['subject']}]: {f['detail']}")
                self.stdout.write(f"    change: {f['setting']}")
        sys.stdout.flush()
        if not got["healthy"]:
            sys.exit(1)
