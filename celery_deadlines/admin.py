"""The operator's view of the run ledger, in the Django admin.

Read-only: every run, its deadline and time left, status and reason, owner, lease
expiry (UTC), version, attempt, fencing token, last checkpoint, and the timeline of
every compare-and-swap. The only writes are two explicit actions, each behind its own
permission and each one compare-and-swap through the store: **expire now** and
**requeue** (only while the deadline allows).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .clock import get_clock
from .explain import utc
from .ledger import operations, outbox
from .ledger.sql.connection import Store
from .ledger.sql.effects import Pending
from .models import Effect, EffectState, Run, RunEvent, RunPlan


def describe_time_left(run: Run) -> str:
    """``12.3 s left``, ``passed 4.0 s ago``, ``no deadline`` or ``ended``."""
    if run.deadline is None:
        return "no deadline"
    if run.is_terminal:
        return "ended"
    left = run.deadline - get_clock().now()
    if left < timedelta(0):
        return f"passed {_human(-left)} ago"
    return f"{_human(left)} left"


def _human(duration: timedelta) -> str:
    seconds = duration.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class RunEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = RunEvent
    fields = readonly_fields = (
        "at",
        "kind",
        "outcome",
        "status",
        "reason",
        "version",
        "lease_token",
        "owner",
        "lease_expires_at",
        "detail",
    )
    extra = 0
    can_delete = False
    ordering = ("id",)
    verbose_name_plural = "event timeline (every compare-and-swap, database clock)"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


LEASE_FIELDS = (
    "owner",
    "lease_expires_at",
    "lease_token",
    "version",
    "attempt",
    "lost_leases",
    "retries",
)
CHECKPOINT_FIELDS = ("checkpoint_name", "checkpoint_data", "checkpoint_at", "checkpoint_token")


LEASE_FIELDS = (
    "owner",
    "lease_expires_at",
    "lease_token",
    "version",
    "attempt",
    "lost_leases",
    "retries",
)
CHECKPOINT_FIELDS = ("checkpoint_name", "checkpoint_data", "checkpoint_at", "checkpoint_token")


class EffectInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Effect
    fields = readonly_fields = (
        "key",
        "name",
        "kind",
        "state",
        "lease_token",
        "dispatches",
        "result",
        "evidence",
        "error",
        "dispatched_at",
        "updated_at",
    )
    extra = 0
    can_delete = False
    verbose_name_plural = "side effects (at most once per key)"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RunPlanInline(admin.TabularInline):  # type: ignore[type-arg]
    model = RunPlan
    fields = readonly_fields = (
        "plan_id",
        "state",
        "reason",
        "detail",
        "lease_token",
        "created_at",
        "ended_at",
        "document",
    )
    extra = 0
    can_delete = False
    verbose_name_plural = "plans (the active one, and invalidated ones kept as history)"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "task_id",
        "task_name",
        "status",
        "reason",
        "deadline_utc",
        "time_left",
        "owner",
        "lease_expires_utc",
        "version",
        "attempt",
        "lease_token",
        "checkpoint_name",
    )
    list_filter = ("status", "reason", "task_name")
    search_fields = ("=task_id", "=root_id", "=parent_id")
    search_help_text = "An exact task id, root id or parent id."
    ordering = ("-id",)
    list_per_page = 50
    actions = ("expire_now", "requeue")
    inlines = (EffectInline, RunPlanInline, RunEventInline)
    fieldsets = (
        (None, {"fields": ("task_id", "task_name", "status", "reason", "detail")}),
        ("Time", {"fields": ("deadline", "time_left", "delivery_deadline", "available_at")}),
        (
            "Schedule (the occurrence this run is for)",
            {"fields": ("schedule", "schedule_zone", "schedule_local", "not_before")},
        ),
        ("Lease (who may act on this run now)", {"fields": LEASE_FIELDS}),
        ("Last durable checkpoint", {"fields": CHECKPOINT_FIELDS}),
        ("Workflow", {"fields": ("root_link", "parent_link", "children")}),
        ("Outbox", {"fields": ("message", "published_at", "created_at", "updated_at")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        names: list[str] = []
        for _, section in self.fieldsets:
            names.extend(str(name) for name in section["fields"])
        return names

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_expire_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("celery_deadlines.expire_run")

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("celery_deadlines.requeue_run")

    @admin.display(description="deadline (UTC)", ordering="deadline")
    def deadline_utc(self, run: Run) -> str:
        return utc(run.deadline)

    @admin.display(description="lease expires (UTC)", ordering="lease_expires_at")
    def lease_expires_utc(self, run: Run) -> str:
        return utc(run.lease_expires_at)

    @admin.display(description="time left")
    def time_left(self, run: Run) -> str:
        return describe_time_left(run)

    @admin.display(description="root")
    def root_link(self, run: Run) -> SafeString | str:
        return self._link(run.root_id) if run.root_id != run.task_id else "this run"

    @admin.display(description="parent")
    def parent_link(self, run: Run) -> SafeString | str:
        return self._link(run.parent_id) if run.parent_id else "-"

    @admin.display(description="children")
    def children(self, run: Run) -> SafeString | str:
        found = Run.objects.using(run._state.db).filter(parent_id=run.task_id).order_by("id")
        if not found:
            return "-"
        return format_html_join(
            ", ",
            '<a href="{}">{}</a> ({})',
            ((self._url(child), child.task_name, child.status) for child in found),
        )

    @admin.display(description="message")
    def message(self, run: Run) -> str:
        if run.message_body is None:
            return "-"
        try:
            decoded = outbox.decode_message(
                bytes(run.message_body), run.content_type, run.content_encoding
            )
        except Exception:  # noqa: BLE001 - show what cannot be decoded, never fail the page
            return f"{run.content_type}, {len(run.message_body)} bytes (not decodable here)"
        return json.dumps(decoded, indent=2, default=repr)

    def _link(self, task_id: str) -> SafeString | str:
        target = Run.objects.filter(task_id=task_id).first()
        if target is None:
            return task_id
        return format_html('<a href="{}">{}</a>', self._url(target), target)

    @staticmethod
    def _url(run: Run) -> str:
        return reverse("admin:celery_deadlines_run_change", args=[run.pk])

    @admin.action(description="Expire now (fences the current holder)", permissions=["expire"])
    def expire_now(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        said = "Expired now (expired_by_operator); the caller told"
        self._act(request, queryset, operations.expire_run, "expired", said)

    @admin.action(description="Requeue (if the deadline allows)", permissions=["requeue"])
    def requeue(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        said = "Requeued with a fresh token; its message published"
        self._act(request, queryset, operations.requeue_run, "requeued", said)

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

        store, operator = Store(queryset.db), _operator(request)
        done = [run for run in queryset if operation(current_app, store, run.pk, operator=operator)]
        for run in done:
            self.log_change(request, run, said)
        self._report(request, verb, done, queryset.count())

    def _report(self, request: HttpRequest, verb: str, done: list[Run], asked: int) -> None:
        self.message_user(request, f"{len(done)} of {asked} run(s) {verb}.", messages.SUCCESS)
        if len(done) < asked:
            self.message_user(
                request,
                f"{asked - len(done)} run(s) not {verb}: finished, held by a live lease, "
                "past the deadline, or waiting for an effect to be resolved (see its "
                "effects).",
                messages.WARNING,
            )


def _released(status: str) -> str:
    """What releasing a run after its effects were settled did, in an operator's words."""
    if status == "QUEUED":
        return "requeued (its next attempt replays or dispatches the effect)"
    return "expired (deadline_passed: the deadline passed while the outcome was unknown)"


def _operator(request: HttpRequest) -> str:
    user = request.user
    return f"operator {user.get_username()}" if user.is_authenticated else "an operator"


@admin.register(Effect)
class EffectAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Effects, and the operator's way out of UNKNOWN: resolve with evidence."""

    list_display = (
        "key",
        "name",
        "kind",
        "state",
        "run_link",
        "lease_token",
        "dispatches",
        "evidence",
        "updated_at",
    )
    list_filter = ("state", "kind", "name")
    search_fields = ("=key",)
    ordering = ("-id",)
    actions = ("resolve",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in Effect._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("celery_deadlines.resolve_effect")

    @admin.display(description="run")
    def run_link(self, effect: Effect) -> SafeString:
        url = reverse("admin:celery_deadlines_run_change", args=[effect.run_id])
        return format_html('<a href="{}">{}</a>', url, effect.run)

    @admin.action(description="Resolve an unknown outcome, with evidence", permissions=["resolve"])
    def resolve(self, request: HttpRequest, queryset: QuerySet[Effect]) -> Any:
        from django.template.response import TemplateResponse

        unknown = list(queryset.filter(state__in=[EffectState.UNKNOWN, EffectState.DISPATCHED]))
        if "apply" not in request.POST:
            return TemplateResponse(
                request,
                "admin/celery_deadlines/resolve_effects.html",
                {**self.admin_site.each_context(request), "effects": unknown},
            )
        evidence = str(request.POST.get("evidence", "")).strip()
        found = request.POST.get("found") == "yes"
        try:
            result = json.loads(request.POST.get("result") or "null") if found else None
        except ValueError:
            self.message_user(request, "The result must be JSON.", messages.ERROR)
            return None
        if not evidence:
            self.message_user(request, "Evidence is required.", messages.ERROR)
            return None
        from celery import current_app

        store = Store(queryset.db)
        operator = _operator(request)
        resolved, changed, released = 0, [], []
        for effect in unknown:
            seen = _seen(request, effect)
            if seen is None:
                changed.append(f"{effect.key}: the form did not say which dispatch you saw")
                continue
            settled = operations.settle_effect(
                current_app,
                store,
                seen,
                found=found,
                result=result,
                evidence=f"{evidence} ({operator})",
                by=operator,
            )
            if settled.applied:
                resolved += 1
                said = f"Resolved as {'found' if found else 'not found'}: {evidence}"
                if settled.released:
                    moved = _released(settled.released)
                    released.append(f"run {effect.run.task_id} {moved}")
                    said += f"; run {moved}"
                self.log_change(request, effect, said)
            else:
                changed.append(settled.detail)
        verdict = "found" if found else "not found"
        summary = f"{resolved} effect(s) resolved as {verdict}"
        self.message_user(
            request, f"{summary}; {', '.join(released)}." if released else f"{summary}."
        )
        for detail in changed:
            self.message_user(request, f"Not resolved: {detail}", messages.WARNING)
        return None


def _seen(request: HttpRequest, effect: Effect) -> Pending | None:
    """The dispatch the operator looked at when filling the form (``seen-<pk>`` is
    ``state:dispatches:token:run``): the settlement applies only to that dispatch."""
    try:
        state, dispatches, token, run_id = str(request.POST[f"seen-{effect.pk}"]).split(":")
        return Pending(
            key=effect.key,
            name=effect.name,
            fingerprint=effect.fingerprint,
            lease_token=int(token),
            run_id=int(run_id),
            task_id=effect.run.task_id,
            task_name=effect.run.task_name,
            state=state,
            dispatches=int(dispatches),
        )
    except (KeyError, ValueError):
        return None
