"""What every page of the ledger's admin shares: read-only, the operator's name, and
the numbers a submitted form names (a row's id, a dispatch), each checked before it
reaches a query."""

from __future__ import annotations

import re
from typing import Any, Final

from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from ..rules.quoting import shown

#: The largest number the ledger's integer columns hold (PostgreSQL's ``bigint``,
#: SQLite's ``INTEGER``): a form's number beyond it names no row, and a query given one
#: fails (``bigint out of range``; SQLite: ``OverflowError``).
LARGEST: Final = 2**63 - 1
#: A whole number as a form writes it: ASCII digits (``int()`` also takes other
#: scripts' digits, ``"1_0"`` and spaces), at most as many as :data:`LARGEST` has.
_DIGITS: Final = re.compile(r"[0-9]{1,19}")


def form_number(text: object) -> int | None:
    """``text`` as a whole number from 0 to :data:`LARGEST`, or ``None``."""
    if not isinstance(text, str) or _DIGITS.fullmatch(text) is None:
        return None
    number = int(text)
    return number if number <= LARGEST else None


def forged(message: str) -> HttpResponse:
    """The answer to a submission no page of this admin writes: 400, with ``message``
    (which says nothing was done), as plain text."""
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


class ReadOnlyAdmin:
    """The ledger is written by its own statements only: no add, change or delete in
    the admin (viewing needs the model's view permission). Actions check their own
    permissions (``has_<name>_permission``), and run only on rows named by whole
    numbers: any other selection answers 400 and nothing is done."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """Django's, once every selected row (``_selected_action``) is a whole number an
        id can be: Django filters by them as given, and a query given ``"abc"`` or
        ``10**23`` fails (a 500)."""
        for selected in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            if form_number(selected) is None:
                return forged(
                    f"A selected row must be named by its id, a whole number from 0 to "
                    f"{LARGEST}; got {shown(selected)}. Nothing was done."
                )
        answer: HttpResponse | None = super().response_action(  # type: ignore[misc]
            request, queryset, *args, **kwargs
        )
        return answer


def operator(request: HttpRequest) -> str:
    """Who acts, as the ledger records it."""
    user = request.user
    return f"operator {user.get_username()}" if user.is_authenticated else "an operator"
