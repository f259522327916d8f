"""``manage.py deadlines explain TASK_ID``, ``manage.py deadlines reconcile`` and
``manage.py deadlines purge`` (:mod:`celery_deadlines.management.purge`)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...explain import explain, facts
from ...ledger.reconcile import reconcile_once
from ...ledger.sql.connection import Store
from ...models import Run
from .. import purge


class Command(BaseCommand):
    help = "Explain a run from the ledger, reconcile the ledger once, or purge ended runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default", help="the ledger's alias")
        actions = parser.add_subparsers(dest="action", required=True)
        explain_parser = actions.add_parser("explain", help="answer the operator checklist")
        explain_parser.add_argument("task_id")
        explain_parser.add_argument("--json", action="store_true", help="the answers as JSON")
        actions.add_parser("reconcile", help="one pass of restart reconciliation and sweeping")
        purge.add_parser(actions)

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        store = Store(using)
        if options["action"] == "purge":
            purge.handle(self, store, options)
            return
        if options["action"] == "explain":
            run = Run.objects.using(using).filter(task_id=options["task_id"]).first()
            if run is None:
                raise CommandError(f"no run with task id {options['task_id']!r}")
            events = list(run.events.using(using).order_by("id"))
            effects = list(run.effects.using(using).order_by("id"))
            now = store.database_now()
            if options["json"]:
                self.stdout.write(json.dumps(facts(run, events, effects, now), indent=2))
            else:
                self.stdout.write("\n".join(explain(run, events, now, effects)))
            return
        from celery import current_app

        report = reconcile_once(current_app, store)
        self.stdout.write(str(report))
