"""Load past request history into the demand buckets (docs/api.md, "Request history")."""

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.core.errors import DomainError
from controlplane.core.history import FORMATS, Defaults
from controlplane.demand.history import import_history


class Command(BaseCommand):
    help = (
        "Import a history file (JSONL, CSV, a vLLM log with --enable-log-requests, or a "
        "vllm-router log) into the demand buckets, all or nothing, audited."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="the history file")
        parser.add_argument("--format", default="auto", choices=["auto", *FORMATS])
        parser.add_argument("--model", default="", help="for rows (and logs) that name none")
        parser.add_argument(
            "--tenant", default="", help="for rows that name none (default: the model name)"
        )
        parser.add_argument("--block-size", type=int, default=16, help="for token ids")
        parser.add_argument(
            "--source", default="", help="e.g. the engine whose log it is (see docs/api.md)"
        )
        parser.add_argument("--year", type=int, default=None, help="vLLM logs: their year")
        parser.add_argument(
            "--utc-offset-minutes", type=int, default=0, help="vLLM logs: their zone"
        )
        parser.add_argument("--user", default="", help="the user the audit record names")

    def handle(self, file, **o):
        path = Path(file)
        if not path.is_file():
            raise CommandError(f"no file {file}")
        who = None
        if o["user"]:
            who = get_user_model().objects.filter(username=o["user"]).first()
            if who is None:
                raise CommandError(f"no user {o['user']!r}")
        if not 1 <= o["block_size"] <= 1 << 20:
            raise CommandError("--block-size must be 1..1048576")
        try:
            with path.open("rb") as f:
                imp, already = import_history(
                    f,
                    fmt=o["format"],
                    defaults=Defaults(
                        model=o["model"],
                        tenant=o["tenant"],
                        block_size=o["block_size"],
                        year=o["year"],
                        utc_offset_minutes=o["utc_offset_minutes"],
                    ),
                    source=o["source"],
                    filename=path.name,
                    who=who,
                )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        if already:
            self.stdout.write(
                f"{path.name} was imported before (import {imp.pk} at "
                f"{imp.created_at:%Y-%m-%d %H:%M}): nothing changed"
            )
            return
        skipped = imp.skipped_live + imp.skipped_old + imp.skipped_seen
        self.stdout.write(
            f"import {imp.pk}: {imp.requests} requests from {imp.rows} rows of {imp.lines} lines "
            f"into {imp.workload_keys} workload keys ({imp.workload_keys_created} new), "
            f"{imp.first_time:%Y-%m-%d %H:%M} to {imp.last_time:%Y-%m-%d %H:%M} UTC; "
            f"{skipped} requests skipped (live {imp.skipped_live}, old {imp.skipped_old}, "
            f"seen {imp.skipped_seen}); {imp.seconds:.1f} s"
            if imp.requests
            else f"import {imp.pk}: no request counted ({skipped} skipped: live "
            f"{imp.skipped_live}, old {imp.skipped_old}, seen {imp.skipped_seen})"
        )
