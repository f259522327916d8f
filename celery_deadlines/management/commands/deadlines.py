"""``manage.py deadlines explain TASK_ID [--json]`` and ``manage.py deadlines reconcile
[--json]``: text for a person, JSON for a script, both from the same values; and
``manage.py deadlines purge`` (:mod:`celery_deadlines.management.purge`)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import conf
from ...explain import explanation_of, render_text, task_ids_named, to_json, typed_id
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
        explain_parser.add_argument(
            "task_id", help="the run's task id, or its start if no other run's begins so"
        )
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

    def explain(self, given: str, using: str, *, as_json: bool) -> None:
        """Explain the run ``given`` names: its task id, or the start of one no other
        run's task id shares (the short id the admin lists); a start several share is
        refused with their ids."""
        most = 5
        named = task_ids_named(given, using, most)
        if not named:
            raise CommandError(f"no run with task id {given!r}, nor one starting with it")
        if len(named) > 1:
            shown = ", ".join(printable(task_id) for task_id in named[:most])
            more = " and more" if len(named) > most else ""
            raise CommandError(
                f"{given!r} is not unique: the task ids of {shown}{more} start with it; "
                "give more of the id"
            )
        task_id = named[0]
        if task_id != typed_id(given):  # said on stderr: stdout stays the answer (--json)
            self.stderr.write(f"run {printable(task_id)} (its task id starts with {given!r})")
        explanation = explanation_of(task_id, using)
        if explanation is None:  # purged between the two reads
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
