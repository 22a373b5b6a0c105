"""Set an engine's lifecycle from a shell (drain a node's engines before maintenance)."""

from django.core.management.base import BaseCommand, CommandError

from controlplane.core.errors import DomainError
from controlplane.fleet.choices import EngineLifecycle
from controlplane.fleet.models import Engine
from controlplane.fleet.services import change_engine_lifecycle


class Command(BaseCommand):
    help = "Move an engine (node/engine_id, or its id) to warming, serving or draining, audited."

    def add_arguments(self, parser):
        parser.add_argument("engine", help="node/engine_id as the agent names it, or the engine id")
        parser.add_argument("lifecycle", choices=[c for c, _ in EngineLifecycle.CHOICES])
        parser.add_argument("--reason", default="")

    def handle(self, engine, lifecycle, reason, **opts):
        if engine.isdigit():
            found = Engine.objects.filter(pk=int(engine)).first()
        elif "/" in engine:
            node, engine_id = engine.split("/", 1)
            found = Engine.objects.filter(node__name=node, engine_id=engine_id).first()
        else:
            raise CommandError("name the engine as node/engine_id or by its id")
        if found is None:
            raise CommandError(f"no engine {engine!r}")
        try:
            changed = change_engine_lifecycle(
                found, lifecycle, None, reason=reason or "manage.py engine_lifecycle"
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"{changed}: {changed.lifecycle}")
