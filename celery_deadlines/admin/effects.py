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
from ..models import Effect, EffectState
from . import resolving
from .base import ReadOnlyAdmin, forged, operator
from .display import STYLE, badge, breakable, effect_badge, released_as, short_id, utc
from .listing import BoundedPaginator, ConsoleChangeList, EffectNameFilter, console_queryset
from .resolving import ResolveForm

#: The effect's instants, shown in UTC to the millisecond.
INSTANTS = ("created_at", "dispatched_at", "updated_at", "asked_at")


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Effects, and the operator's way out of UNKNOWN: resolve with evidence."""

    change_list_template = "admin/celery_deadlines/effect/change_list.html"
    # two-line cells where two facts go together, so the list fits a 1,366-pixel
    # screen with the sidebar open (the browser test measures it)
    list_display = (
        "key_breakable",
        "name_and_kind",
        "state_and_updated",
        "run_link",
        "token_and_dispatch",
        "evidence_short",
    )
    # as the run list (admin/listing.py): every query reads an index at any size
    list_filter = ("state", "kind", ("name", EffectNameFilter))
    list_select_related = ("run",)
    show_facets = admin.ShowFacets.NEVER
    show_full_result_count = False
    paginator = BoundedPaginator
    # the one column with an ordering (its unique index): no other sorts, even by URL
    sortable_by = ("key_breakable",)
    search_fields = ("=key",)
    search_help_text = "An exact effect key."
    ordering = ("-id",)
    actions = ("resolve",)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ConsoleChangeList]:
        return ConsoleChangeList

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

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        return super().changelist_view(request, {**(extra_context or {}), "cdl": STYLE})

    @admin.display(description="key", ordering="key")
    def key_breakable(self, effect: Effect) -> SafeString:
        """The key, wrapping after its separators (``order-42:capture:v1``)."""
        return breakable(effect.key)

    @admin.display(description="name / kind")
    def name_and_kind(self, effect: Effect) -> SafeString:
        return format_html("{}<br>{}", breakable(effect.name), effect.kind)

    @admin.display(description="state / updated (UTC)")
    def state_and_updated(self, effect: Effect) -> SafeString:
        """The state as a badge (UNKNOWN stands out), above its last change."""
        return format_html("{}<br>{}", effect_badge(effect.state), utc(effect.updated_at))

    @admin.display(description="token / dispatch")
    def token_and_dispatch(self, effect: Effect) -> str:
        """The token of the attempt that last acted on it, and its dispatch number."""
        return f"{effect.lease_token} / {effect.dispatches}"

    @admin.display(description="evidence")
    def evidence_short(self, effect: Effect) -> SafeString | str:
        """The evidence as JSON, its first 80 characters (the whole as the title)."""
        if effect.evidence is None:
            return "-"
        whole = json.dumps(effect.evidence, default=repr)
        shown = whole if len(whole) <= 80 else f"{whole[:79]}…"
        return format_html('<span title="{}">{}</span>', whole, shown)

    @admin.display(description="created (UTC)", ordering="created_at")
    def created_at_utc(self, effect: Effect) -> str:
        return utc(effect.created_at)

    @admin.display(description="dispatched (UTC)", ordering="dispatched_at")
    def dispatched_at_utc(self, effect: Effect) -> str:
        return utc(effect.dispatched_at)

    @admin.display(description="updated (UTC)", ordering="updated_at")
    def updated_at_utc(self, effect: Effect) -> str:
        return utc(effect.updated_at)

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
            breakable(short_id(run.task_id)),
            badge(run.status),
        )

    @admin.action(description="Resolve an unknown outcome, with evidence", permissions=["resolve"])
    def resolve(self, request: HttpRequest, queryset: QuerySet[Effect]) -> Any:
        """The resolve form (what resolving does to each run, by the database clock),
        then each selected effect settled as the operator says, through
        :func:`~celery_deadlines.ledger.operations.settle_effect`. A submission with an
        error is shown again, the errors beside their fields, nothing lost; one naming a
        dispatch the form never writes (:func:`.resolving.seen_in`) answers 400 and
        settles nothing."""
        unknown = list(
            queryset.filter(state__in=[EffectState.UNKNOWN, EffectState.DISPATCHED]).select_related(
                "run"
            )
        )
        store = Store(queryset.db)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta}
        if "apply" not in request.POST:
            return resolving.page(
                request, context, unknown, ResolveForm(), now=store.database_now()
            )
        try:  # every dispatch the form names is read before anything else
            seen = {effect.pk: resolving.seen_in(request.POST, effect) for effect in unknown}
        except ValueError as error:
            return forged(str(error))
        form = ResolveForm(request.POST)
        if not form.is_valid():
            return resolving.page(
                request, context, unknown, form, now=store.database_now(), seen=request.POST
            )
        from celery import current_app

        found = form.cleaned_data["found"] == "yes"
        evidence = form.cleaned_data["evidence"].strip()
        who = operator(request)
        resolved, changed, released = 0, [], []
        for effect in unknown:
            dispatch = seen[effect.pk]
            if dispatch is None:
                changed.append(f"{effect.key}: the form did not say which dispatch you saw")
                continue
            settled = operations.settle_effect(
                current_app,
                store,
                dispatch,
                found=found,
                result=form.cleaned_data["replayed"],
                evidence=f"{evidence} ({who})",
                by=who,
            )
            if settled.applied:
                resolved += 1
                said = f"Resolved as {'found' if found else 'not found'}: {evidence}"
                if settled.released:
                    moved = released_as(settled.released, settled.reason)
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
