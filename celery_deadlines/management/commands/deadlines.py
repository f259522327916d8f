"""``manage.py deadlines explain TASK_ID [--json]`` and ``manage.py deadlines reconcile
[--json]``: text for a person, JSON for a script, both from the same values; and
``manage.py deadlines purge`` (:mod:`celery_deadlines.management.purge`)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import conf
from ...explain import explanation_of, render_text, to_json
from ...explain.text import printable
from ...ledger.reconcile import reconcile_once
from ...ledger.sql.connection import Store
from .. import purge


class Command(BaseCommand):
    help = "Explain a run from the ledger, reconcile the ledger once, or purge ended runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="the ledger's database alias (default: CELERY_DEADLINES_DATABASE)",
        )
        actions = parser.add_subparsers(dest="action", required=True)
        explain_parser = actions.add_parser("explain", help="answer the operator checklist")
        explain_parser.add_argument("task_id")
        explain_parser.add_argument("--json", action="store_true", help="the answers as JSON")
        reconcile_parser = actions.add_parser(
            "reconcile", help="one pass of restart reconciliation and sweeping"
        )
        reconcile_parser.add_argument(
            "--json", action="store_true", help="the ids of each category as JSON"
        )
        purge.add_parser(actions)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] is None:  # as the system checks read it
            options["database"] = getattr(django_settings, conf.DATABASE.django_name, "default")
        if options["action"] == "purge":
            purge.handle(self, Store(options["database"]), options)
        elif options["action"] == "explain":
            self.explain(options["task_id"], options["database"], as_json=options["json"])
        else:
            self.reconcile(options["database"], as_json=options["json"])

    def explain(self, task_id: str, using: str, *, as_json: bool) -> None:
        explanation = explanation_of(task_id, using)
        if explanation is None:
            raise CommandError(f"no run with task id {task_id!r}")
        if as_json:
            self.stdout.write(to_json(explanation))
        else:
            self.stdout.write("\n".join(render_text(explanation)))

    def reconcile(self, using: str, *, as_json: bool) -> None:
        from celery import current_app

        report = reconcile_once(current_app, Store(using))
        if as_json:
            self.stdout.write(json.dumps(report.to_json(), indent=2))
        else:
            self.stdout.write("\n".join(printable(line) for line in report.lines()))
