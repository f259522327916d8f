"""Effects, and the operator's way out of UNKNOWN: resolve with evidence (a form that
names the dispatch the operator saw; the settlement applies only to that dispatch)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..ledger import operations
from ..ledger.sql.connection import Store
from ..ledger.sql.effects import Pending
from ..models import Effect, EffectState
from .base import ReadOnlyAdmin, operator
from .display import badge, short_id, utc
from .listing import BoundedPaginator, EffectNameFilter, console_queryset

#: The effect's instants, shown in UTC to the millisecond.
INSTANTS = ("created_at", "dispatched_at", "updated_at", "asked_at")


def _released(status: str) -> str:
    """What releasing a run after its effects were settled did, in an operator's words."""
    if status == "QUEUED":
        return "requeued (its next attempt replays or dispatches the effect)"
    return "expired (deadline_passed: the deadline passed while the outcome was unknown)"


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
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
        "updated_utc",
    )
    # as the run list (admin/listing.py): every query reads an index at any size
    list_filter = ("state", "kind", ("name", EffectNameFilter))
    list_select_related = ("run",)
    show_facets = admin.ShowFacets.NEVER
    show_full_result_count = False
    paginator = BoundedPaginator
    sortable_by = ("key",)
    search_fields = ("=key",)
    search_help_text = "An exact effect key."
    ordering = ("-id",)
    actions = ("resolve",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Effect]:
        return console_queryset(super().get_queryset(request))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Effect], search_term: str
    ) -> tuple[QuerySet[Effect], bool]:
        """The effect whose key is exactly ``search_term`` (its unique index; Django's
        ``=key`` would compare upper-cased keys and read every effect)."""
        term = search_term.strip()
        return (queryset.filter(key=term) if term else queryset), False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [
            f"{field.name}_utc" if field.name in INSTANTS else field.name
            for field in Effect._meta.fields
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return list(self.get_fields(request, obj))

    @admin.display(description="created (UTC)", ordering="created_at")
    def created_at_utc(self, effect: Effect) -> str:
        return utc(effect.created_at)

    @admin.display(description="dispatched (UTC)", ordering="dispatched_at")
    def dispatched_at_utc(self, effect: Effect) -> str:
        return utc(effect.dispatched_at)

    @admin.display(description="updated (UTC)", ordering="updated_at")
    def updated_at_utc(self, effect: Effect) -> str:
        return utc(effect.updated_at)

    updated_utc = updated_at_utc

    @admin.display(description="last asked for (UTC)", ordering="asked_at")
    def asked_at_utc(self, effect: Effect) -> str:
        return utc(effect.asked_at)

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("celery_deadlines.resolve_effect")

    @admin.display(description="run")
    def run_link(self, effect: Effect) -> SafeString:
        """The run's short id (the whole one as its title) and status: the task's name
        is on its page, and would widen the list past a laptop's screen."""
        run = effect.run
        url = reverse("admin:celery_deadlines_run_change", args=[effect.run_id])
        return format_html(
            '<a href="{}" title="{}">{}</a> {}',
            url,
            f"{run.task_name}[{run.task_id}]",
            short_id(run.task_id),
            badge(run.status),
        )

    @admin.action(description="Resolve an unknown outcome, with evidence", permissions=["resolve"])
    def resolve(self, request: HttpRequest, queryset: QuerySet[Effect]) -> Any:
        from django.template.response import TemplateResponse

        unknown = list(queryset.filter(state__in=[EffectState.UNKNOWN, EffectState.DISPATCHED]))
        if "apply" not in request.POST:
            return TemplateResponse(
                request,
                "admin/celery_deadlines/resolve_effects.html",
                {
                    **self.admin_site.each_context(request),
                    "effects": unknown,
                    "opts": self.model._meta,
                    "title": "Resolve effects of unknown outcome",
                },
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
        who = operator(request)
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
                evidence=f"{evidence} ({who})",
                by=who,
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
