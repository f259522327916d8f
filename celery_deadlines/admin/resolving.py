"""The resolve form: what the operator says of an effect of unknown outcome (found or
not, the evidence, the result to replay), what resolving will do to each run before
they submit (its deadline, by the database clock), and the form shown again with its
errors beside the fields, their words kept, when a submission is incomplete."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from django import forms
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ..ledger.sql.effects import Pending
from ..models import Effect, EffectState
from ..rules.quoting import shown
from .base import LARGEST, form_number
from .display import STYLE, effect_badge, resolving_does, short_id

#: The page of the form (``templates/admin/celery_deadlines/resolve_effects.html``).
TEMPLATE = "admin/celery_deadlines/resolve_effects.html"
#: The states a dispatch the form shows can be in (``seen-<pk>`` starts with one).
_STATES: Final = frozenset(state.value for state in EffectState)


class ResolveForm(forms.Form):
    """Found or not, with evidence; a found effect's result, as JSON."""

    found = forms.ChoiceField(
        choices=(("yes", "found"), ("no", "not found")),
        widget=forms.RadioSelect,
        error_messages={"required": "Say whether the provider's records show it: found or not."},
    )
    evidence = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        error_messages={
            "required": "Evidence is required: a provider reference, a lookup, a ticket."
        },
    )
    result = forms.CharField(
        required=False,
        initial="null",
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
    )

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if cleaned.get("found") != "yes":
            cleaned["replayed"] = None
            return cleaned
        try:
            cleaned["replayed"] = json.loads(cleaned.get("result") or "null")
        except ValueError as error:
            self.add_error("result", f"The result to replay must be JSON ({error}).")
        except RecursionError:  # "[[[[..." nested deeper than the decoder goes
            self.add_error("result", "The result to replay is nested too deep to read.")
        return cleaned


def seen_of(effect: Effect) -> str:
    """The dispatch the form shows (``state:dispatches:token:run``): the settlement
    applies only to it (:class:`~celery_deadlines.ledger.sql.effects.Pending`)."""
    return f"{effect.state}:{effect.dispatches}:{effect.lease_token}:{effect.run_id}"


def seen_in(form: Mapping[str, Any], effect: Effect) -> Pending | None:
    """The dispatch of ``effect`` the operator looked at when filling the form (its
    ``seen-<pk>``, as :func:`seen_of` wrote it): the settlement applies only to that
    dispatch. ``None`` when the form has none (the effect was selected but not shown:
    it changed state since); ``ValueError`` when it is not one :func:`seen_of` writes
    (its state not an effect's, a number not a whole one a column holds)."""
    field = f"seen-{effect.pk}"
    given = form.get(field)
    if given is None:
        return None
    state, *written = str(given).split(":")
    numbers = [number for number in map(form_number, written) if number is not None]
    if state not in _STATES or len(written) != 3 or len(numbers) != 3:
        raise ValueError(
            f"{field} must be the dispatch the form showed (state:dispatches:token:run, "
            f"each number from 0 to {LARGEST}); got {shown(given)}. Nothing was resolved."
        )
    dispatches, token, run_id = numbers
    return Pending(
        key=effect.key,
        name=effect.name,
        fingerprint=effect.fingerprint,
        lease_token=token,
        run_id=run_id,
        task_id=effect.run.task_id,
        task_name=effect.run.task_name,
        state=state,
        dispatches=dispatches,
    )


def page(
    request: HttpRequest,
    context: Mapping[str, Any],
    effects: Sequence[Effect],
    form: ResolveForm,
    *,
    now: datetime,
    seen: Mapping[str, str] | None = None,
) -> TemplateResponse:
    """The form for ``effects``: each with its run's deadline and what resolving does
    now (by the database clock ``now``), and, for a form shown again, the dispatch the
    operator saw first (``seen``: ``seen-<pk>`` from their submission), not a newer one."""
    rows = []
    for effect in effects:
        run = effect.run
        past, does = resolving_does(deadline=run.deadline, now=now)
        rows.append(
            {
                "effect": effect,
                "state": effect_badge(effect.state),
                "run": short_id(run.task_id),
                "run_id": run.task_id,
                "seen": (seen or {}).get(f"seen-{effect.pk}") or seen_of(effect),
                "past": past,
                "does": does,
            }
        )
    return TemplateResponse(
        request,
        TEMPLATE,
        {
            **context,
            "rows": rows,
            "form": form,
            "any_past": any(row["past"] for row in rows),
            "cdl": STYLE,
            "title": f"Resolve {len(rows)} effect(s) of unknown outcome",
        },
    )
