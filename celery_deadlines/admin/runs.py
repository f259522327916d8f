"""Runs: a compact list, and a page that answers the operator checklist (the summary by
the database clock, from :func:`celery_deadlines.explain.explanation_of`), then the
timeline, effects, the workflow, the message and the result. Three actions: **expire
now**, **requeue** and **cancel with everything it started**, each behind its own
permission, each recorded as a ``LogEntry``."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..clock import get_clock
from ..core.cancelling import tell_workers
from ..explain import Explanation, explanation_of
from ..explain import text as said
from ..ledger import operations
from ..ledger.sql.connection import Store
from ..models import Effect, EffectState, Run, Status
from .base import ReadOnlyAdmin, operator
from .display import (
    STYLE,
    badge,
    breakable,
    describe_time_left,
    dotted,
    effect_badge,
    human,
    message_parts,
    short_id,
    utc,
)
from .listing import (
    BoundedPaginator,
    ConsoleChangeList,
    QueueFilter,
    ReasonFilter,
    TaskNameFilter,
    console_queryset,
    search,
)

#: The database clock, read once for the page being rendered (the list's time left).
_database_now: ContextVar[datetime | None] = ContextVar("cdl_database_now", default=None)
#: The run's explanation, built once for the page being rendered: the summary and the
#: sections say the same (one owner, one claim, one runtime).
_explained: ContextVar[Explanation | None] = ContextVar("cdl_explained", default=None)

SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Times (database clock)", ("created_utc", "started", "runtime", "ended", "time_limits")),
    ("Result or error (what the caller was told)", ("result_or_error",)),
    ("Message (what the task was called with)", ("args", "kwargs", "options")),
    (
        "Lease (who may act on this run now)",
        ("owner_now", "lease_expires_utc", "lease_token", "version", "attempt", "lost_leases"),
    ),
    (
        "Last durable checkpoint",
        ("checkpoint_name", "checkpoint_data", "checkpoint_utc", "checkpoint_token"),
    ),
    (
        "Schedule (the occurrence this run is for)",
        ("schedule", "schedule_zone", "schedule_local", "not_before_utc"),
    ),
    ("Outbox", ("retries", "available_utc", "published_utc", "updated_utc")),
)


def _url(run: Run) -> str:
    return reverse("admin:celery_deadlines_run_change", args=[run.pk])


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    change_form_template = "admin/celery_deadlines/run/change_form.html"
    list_display = (
        "short_task_id",
        "task",
        "status_and_reason",
        "created_and_time_left",
        "owner_breakable",
    )
    list_display_links = ("short_task_id",)
    # Every query of the list reads an index, at any size (admin/listing.py; held by
    # tests/django/admin/test_listing_query_plans.py): the statuses are the enum's, the other
    # filters' values a loose index scan, the periods of the date hierarchy one index
    # probe each, the count bounded; only the creation instant sorts (its index).
    date_hierarchy = "created_at"
    list_filter = (
        "status",
        ("reason", ReasonFilter),
        ("task_name", TaskNameFilter),
        ("queue", QueueFilter),
        "created_at",
    )
    show_facets = admin.ShowFacets.NEVER
    show_full_result_count = False
    paginator = BoundedPaginator
    # the one column with an ordering (its index): no other sorts, even asked by URL
    sortable_by = ("created_and_time_left",)
    # what get_search_results searches (Django shows the box for these)
    search_fields = ("task_id", "=root_id", "=parent_id", "task_name")
    search_help_text = (
        "A task id or its start (the short id shown), an exact root id, parent id or "
        "effect key, or part of a task name."
    )
    # newest first, read from cdl_run_created_idx (a filtered page from its filter's
    # index, which holds the creation instant after the value)
    ordering = ("-created_at", "-id")
    list_per_page = 50
    actions = ("expire_now", "requeue", "cancel_tree")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ConsoleChangeList]:
        return ConsoleChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        return console_queryset(super().get_queryset(request))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Run], search_term: str
    ) -> tuple[QuerySet[Run], bool]:
        """:func:`.listing.search`: each kind of id through its index, no duplicates."""
        db = queryset.db

        def runs_of_key(key: str) -> list[int]:
            return list(Effect.objects.using(db).filter(key=key).values_list("run_id", flat=True))

        found = search(
            queryset,
            search_term,
            task_names=lambda: Store(db).console.task_names(),
            runs_of_key=runs_of_key,
            finds=lambda condition: Run.objects.using(db).filter(condition).exists(),
        )
        return found, False

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The sections; one with nothing to show is collapsed."""
        shown = []
        for title, fields in SECTIONS:
            empty = obj is not None and all(
                self._empty(getattr(self, f, None), getattr(obj, f, None), obj) for f in fields
            )
            shown.append((title, {"fields": fields, "classes": ("collapse",) if empty else ()}))
        return shown

    def _empty(self, method: Any, value: Any, run: Run) -> bool:
        shown = method(run) if callable(method) else value
        return shown in (None, "", "-", 0, [], {})

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [name for _, fields in SECTIONS for name in fields]

    def has_expire_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("celery_deadlines.expire_run")

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("celery_deadlines.requeue_run")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("celery_deadlines.cancel_run")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The list, with the database clock read once for every row's time left."""
        token = _database_now.set(Store(self._db(request)).database_now())
        try:
            response = super().changelist_view(request, {**(extra_context or {}), "cdl": STYLE})
            if hasattr(response, "render"):
                response.render()
            return response
        finally:
            _database_now.reset(token)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        """The run's page, its summary and sections made from one explanation."""
        run = self.get_object(request, object_id)
        context = dict(extra_context or {})
        found = None
        if run is not None:
            found = explanation_of(run.task_id, using=run._state.db or "default")
            context.update(self._panels(request, run, found))
        token = _explained.set(found)
        try:
            response = super().change_view(request, object_id, form_url, context)
            if hasattr(response, "render"):
                response.render()  # the sections read the explanation while it is set
            return response
        finally:
            _explained.reset(token)

    def _db(self, request: HttpRequest) -> str:
        return self.get_queryset(request).db

    def _panels(self, request: HttpRequest, run: Run, found: Explanation | None) -> dict[str, Any]:
        """The page's summary (the explanation, by the database clock), timeline,
        effects and workflow."""
        db = run._state.db or "default"
        if found is None:
            return {}
        left, ended = found["time_left_seconds"], found["ended"]
        if ended is not None:
            ran = ended["ran_seconds"]
            time = f"ended {ended['at']}" + (
                f", ran {said.duration(ran)}" if ran is not None else ", never claimed"
            )
        elif left is None:
            time = "no deadline"
        elif left < 0:
            time = f"passed {human(left)} ago"
        else:
            time = f"{human(left)} left"
        # the runs the workflow section names, by their task ids (never the whole
        # family: a root's runs can be a million, and runs recorded without one share '')
        named = {run.root_id, run.parent_id, *(c["task_id"] for c in found["children"])}
        family = {r.task_id: r for r in Run.objects.using(db).filter(task_id__in=named - {""})}
        effects = list(run.effects.using(db).order_by("id"))
        return {
            "cdl": STYLE,
            "summary": found,
            "status_badge": badge(run.status),
            "reason": breakable(run.reason),
            "owner_now": said.owner_now(found),
            "claimed": said.claimed(found),
            "started": said.started(found),
            "runtime": said.runtime(found),
            "time_limits": said.limits_text(found["time_limits"]),
            "time": time,
            "timeline": [
                {**e, "detail": said.event_detail(e, found["task_name"])} for e in found["history"]
            ],
            "effects": [
                {
                    "pk": e.pk,
                    "key": e.key,
                    "name": e.name,
                    "kind": e.kind,
                    "state": effect_badge(e.state),
                    "token": e.lease_token,
                    "dispatches": e.dispatches,
                    "dispatched": utc(e.dispatched_at),
                    "updated": utc(e.updated_at),
                    "error": e.error,
                    "evidence": e.evidence,
                    "unknown": e.state == EffectState.UNKNOWN,
                }
                for e in effects
            ],
            "plans": [
                {
                    "plan_id": p.plan_id or str(p.pk),
                    "state": p.state,
                    "reason": p.reason,
                    "detail": p.detail,
                    "token": p.lease_token,
                    "created": utc(p.created_at),
                    "ended": utc(p.ended_at),
                    "document": json.dumps(p.document, default=repr)[:500],
                }
                for p in run.plans.using(db).order_by("id")
            ],
            "can_resolve": request.user.has_perm("celery_deadlines.resolve_effect"),
            "effect_changelist": reverse("admin:celery_deadlines_effect_changelist"),
            "root": self._family_link(family, run.root_id, run),
            "parent": self._family_link(family, run.parent_id, run),
            "children": [self._family_link(family, c["task_id"], run) for c in found["children"]],
        }

    @staticmethod
    def _family_link(family: dict[str, Run], task_id: str, run: Run) -> SafeString | str:
        if not task_id:
            return ""
        if task_id == run.task_id:
            return format_html("this run {}", badge(run.status))
        member = family.get(task_id)
        if member is None:
            return task_id
        return format_html(
            '<a href="{}">{}</a> {} {}',
            _url(member),
            member.task_id,
            member.task_name,
            badge(member.status),
        )

    @admin.display(description="id")
    def short_task_id(self, run: Run) -> SafeString:
        """A UUID by its first 8 characters, a custom id whole (wrapping after its
        separators); the whole id is the title."""
        return format_html(
            '<span title="{}">{}</span>', run.task_id, breakable(short_id(run.task_id))
        )

    @admin.display(description="status / reason")
    def status_and_reason(self, run: Run) -> SafeString:
        """The status badge above the reason (wrapping only after its underscores): one
        cell, so the list fits a 1,366-pixel screen with the sidebar open."""
        if not run.reason:
            return badge(run.status)
        return format_html(
            '{}<br><span class="cdl-reason">{}</span>', badge(run.status), breakable(run.reason)
        )

    def _said(self, words: Callable[[Explanation], str]) -> str:
        """What the page's explanation says (``-`` outside the run's page)."""
        found = _explained.get()
        return "-" if found is None else words(found)

    @admin.display(description="owner now")
    def owner_now(self, run: Run) -> str:
        """The summary's words: a live lease's owner, else nobody (and the last claim's)."""
        return self._said(said.owner_now)

    @admin.display(description="started (UTC)")
    def started(self, run: Run) -> str:
        return self._said(said.started)

    @admin.display(description="runtime")
    def runtime(self, run: Run) -> str:
        return self._said(said.runtime)

    @admin.display(description="ended (UTC)")
    def ended(self, run: Run) -> str:
        return self._said(lambda f: f["ended"]["at"] if f["ended"] else "-")

    @admin.display(description="time limits")
    def time_limits(self, run: Run) -> str:
        return self._said(lambda f: said.limits_text(f["time_limits"]))

    @admin.display(description="owner")
    def owner_breakable(self, run: Run) -> SafeString:
        """The owner, wrapping after its separators (``celery@host-1.example:42``)."""
        return breakable(run.owner)

    @admin.display(description="task name")
    def task(self, run: Run) -> SafeString:
        return dotted(run.task_name)

    @admin.display(description="time left / ended after")
    def time_left(self, run: Run) -> str:
        now = _database_now.get() or get_clock().now()
        return describe_time_left(
            deadline=run.deadline,
            status=run.status,
            now=now,
            created_at=run.created_at,
            updated_at=run.updated_at,
        )

    @admin.display(description="created (UTC) / time left", ordering="created_at")
    def created_and_time_left(self, run: Run) -> SafeString:
        """One two-line cell, so the list fits a 1,366-pixel screen with the sidebar open."""
        return format_html("{}<br>{}", utc(run.created_at), self.time_left(run))

    @admin.display(description="created (UTC)", ordering="created_at")
    def created_utc(self, run: Run) -> str:
        return utc(run.created_at)

    @admin.display(description="updated (UTC)", ordering="updated_at")
    def updated_utc(self, run: Run) -> str:
        return utc(run.updated_at)

    @admin.display(description="lease expires (UTC)", ordering="lease_expires_at")
    def lease_expires_utc(self, run: Run) -> str:
        return utc(run.lease_expires_at)

    @admin.display(description="checkpoint at (UTC)")
    def checkpoint_utc(self, run: Run) -> str:
        return utc(run.checkpoint_at)

    @admin.display(description="not before (UTC)")
    def not_before_utc(self, run: Run) -> str:
        return utc(run.not_before)

    @admin.display(description="available at (UTC)")
    def available_utc(self, run: Run) -> str:
        return utc(run.available_at)

    @admin.display(description="published at (UTC)")
    def published_utc(self, run: Run) -> str:
        return utc(run.published_at)

    def _message(self, run: Run, part: str) -> str:
        try:
            decoded = message_parts(run.message_body, run.content_type, run.content_encoding)
        except ValueError as error:
            return str(error)
        if decoded is None or decoded.get(part) in (None, [], {}):
            return "-"
        return json.dumps(decoded.get(part), default=repr)

    @admin.display(description="args")
    def args(self, run: Run) -> str:
        return self._message(run, "args")

    @admin.display(description="kwargs")
    def kwargs(self, run: Run) -> str:
        return self._message(run, "kwargs")

    @admin.display(description="options (queue, routing, links)")
    def options(self, run: Run) -> str:
        return self._message(run, "options")

    @admin.display(description="result or error")
    def result_or_error(self, run: Run) -> SafeString | str:
        """The stored result (django-celery-results' ``TaskResult``, linked, when it is
        installed), else the error a failed run ended with and its traceback as the run
        kept it (bounded: ``rules.outcomes.TRACEBACK_LIMIT``)."""
        error: SafeString | str = "-"
        if run.status == Status.FAILED and run.traceback:
            error = format_html('{}<pre class="cdl-traceback">{}</pre>', run.detail, run.traceback)
        elif run.status == Status.FAILED and run.detail:
            error = run.detail
        if not apps.is_installed("django_celery_results"):
            return error
        model = apps.get_model("django_celery_results", "TaskResult")
        stored = model.objects.using(run._state.db).filter(task_id=run.task_id).first()
        if stored is None:
            return error
        shown = str(stored.traceback or stored.result or "")[:2000]
        try:
            url = reverse("admin:django_celery_results_taskresult_change", args=[stored.pk])
        except NoReverseMatch:
            return f"{stored.status}: {shown}"
        return format_html(
            '<a href="{}">{}</a>: <pre class="cdl-traceback">{}</pre>', url, stored.status, shown
        )

    @admin.action(description="Expire now (fences the current holder)", permissions=["expire"])
    def expire_now(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        said = "Expired now (expired_by_operator); the caller told"
        self._act(request, queryset, operations.expire_run, "expired", said)

    @admin.action(description="Requeue (if the deadline allows)", permissions=["requeue"])
    def requeue(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        said = "Requeued with a fresh token; its message published"
        self._act(request, queryset, operations.requeue_run, "requeued", said)

    @admin.action(description="Cancel with everything it started", permissions=["cancel"])
    def cancel_tree(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """Each selected run's deadline, and every run's it started, pulled in to now
        (:func:`celery_deadlines.cancel`): a LogEntry on each selected run that changed."""
        store, who = Store(queryset.db), operator(request)
        changed = 0
        for run in queryset:
            count = operations.cancel_run(store, run.task_id, reason=CANCELLED_HERE, by=who)
            if count:
                changed += count
                self.log_change(request, run, f"Cancelled with {count} run(s) of its tree")
        if changed:
            from celery import current_app

            tell_workers(current_app)
        self.message_user(
            request,
            f"{changed} run(s) cancelled (the selected and what they started); finished "
            "ones are left as they were.",
            messages.SUCCESS,
        )

    def _act(
        self,
        request: HttpRequest,
        queryset: QuerySet[Run],
        operation: Callable[..., bool],
        verb: str,
        said: str,
    ) -> None:
        """Apply one of the ledger's operations to each selected run (the same the
        reconciler uses), record a LogEntry for each it moved, and report."""
        from celery import current_app

        store, who = Store(queryset.db), operator(request)
        done = [run for run in queryset if operation(current_app, store, run.pk, operator=who)]
        for run in done:
            self.log_change(request, run, said)
        asked = queryset.count()
        self.message_user(request, f"{len(done)} of {asked} run(s) {verb}.", messages.SUCCESS)
        if len(done) < asked:
            self.message_user(
                request,
                f"{asked - len(done)} run(s) not {verb}: finished, held by a live lease, "
                "past the deadline, or waiting for an effect to be resolved (see its "
                "effects).",
                messages.WARNING,
            )


#: The reason the admin's cancel records (who: the operator).
CANCELLED_HERE = "cancelled in the admin"

__all__ = ["RunAdmin"]
