"""What keeps the run and effect lists index-backed at any size: Django admin's own
list, with each query it sends given an index to read (migration 0010).

* :class:`IndexedValuesFilter`: a filter on a column whose choices are the values it
  holds (Django's ``AllValuesFieldListFilter``), found by a loose index scan (one probe
  per value, :mod:`celery_deadlines.ledger.sql.console`), not ``SELECT DISTINCT`` over
  every row;
* :class:`ConsoleQuerySet`: the list's queryset, whose ``datetimes()`` (what Django's
  date hierarchy asks for its years, months or days) finds each period with one probe
  of the column's index instead of truncating every row's instant;
* :class:`BoundedPaginator`: a count that reads at most :data:`EXACT_UP_TO` rows, then
  says *about* how many (the planner's estimate) instead of counting a million;
* :func:`search`: an id as the operator has it (a task id or its start, the short id
  the list shows, a root or parent id, an effect key) or part of a task name, each
  through its index and without a join that multiplies rows;
* :class:`ConsoleChangeList`: Django's list, whose date hierarchy's numbers are
  checked before they make a query.

``tests/django/admin/test_listing_query_plans.py`` holds every query of these pages to a plan
without a sequential scan of the run, effect or event table, on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime, timedelta, tzinfo
from functools import cached_property
from typing import Any, Final

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Min, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString

from ..explain import LONGEST_ID, typed_id
from ..ledger.sql.connection import Store
from ..ledger.sql.console import Console
from .display import breakable

#: A list counts its rows exactly up to this many (at most this many index entries
#: read); past it, the planner's estimate, shown as "about".
EXACT_UP_TO: Final = 10_000
#: The most periods one level of the date hierarchy lists (each is one index probe).
MOST_PERIODS: Final = 400


class IndexedValuesFilter(admin.AllValuesFieldListFilter):
    """Django's "all values" filter, its choices read by a loose index scan
    (:meth:`values`), never by ``SELECT DISTINCT`` over the table."""

    def __init__(
        self,
        field: Any,
        request: HttpRequest,
        params: Any,
        model: Any,
        model_admin: Any,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        # the parent's choices are a lazy SELECT DISTINCT; it is never evaluated
        console = Store(model_admin.get_queryset(request).db).console
        self.lookup_choices = self.values(console)  # type: ignore[assignment]

    def values(self, console: Console) -> list[str | None]:
        raise NotImplementedError

    def choices(self, changelist: Any) -> Iterator[Any]:
        """Django's choices, each value wrapping only after its separators (a task
        name after its dots, a reason after its underscores), never inside a word."""
        for choice in super().choices(changelist):
            display = choice.get("display")
            if isinstance(display, str) and not isinstance(display, SafeString):
                choice = {**choice, "display": breakable(display)}
            yield choice


class TaskNameFilter(IndexedValuesFilter):
    def values(self, console: Console) -> list[str | None]:
        return list(console.task_names())


class QueueFilter(IndexedValuesFilter):
    """The queues, and "-" for runs recorded before the queue was (migration 0008)."""

    def values(self, console: Console) -> list[str | None]:
        queues: list[str | None] = list(console.queues())
        return [*queues, None] if console.queue_unrecorded() else queues


class ReasonFilter(IndexedValuesFilter):
    """The reasons runs have (a run without one, e.g. a success, is not listed)."""

    def values(self, console: Console) -> list[str | None]:
        return list(console.reasons())


class EffectNameFilter(IndexedValuesFilter):
    def values(self, console: Console) -> list[str | None]:
        return list(console.effect_names())


class ConsoleQuerySet(QuerySet):  # type: ignore[type-arg]
    """A list page's queryset: Django's, but ``datetimes()`` finds each period by one
    index probe (the earliest instant at or after the period's start, then the next
    period's), as many probes as there are periods, not a read of every row."""

    def datetimes(  # type: ignore[override]
        self,
        field_name: str,
        kind: str,
        order: str = "ASC",
        tzinfo: tzinfo | None = None,
        **_: Any,
    ) -> list[datetime]:
        zone = tzinfo or timezone.get_current_timezone()
        rows = self.order_by()
        periods: list[datetime] = []
        start: datetime | None = None
        while len(periods) < MOST_PERIODS:
            later = rows if start is None else rows.filter(**{f"{field_name}__gte": start})
            first = later.aggregate(first=Min(field_name))["first"]
            if first is None:
                break
            try:  # an instant at the end of what a date holds (a row written by hand)
                period = period_of(timezone.localtime(first, zone), kind)
                periods.append(period)
                start = next_period(period, kind)
            except (OverflowError, ValueError):
                break  # no period after it
        return periods if order == "ASC" else periods[::-1]


class ConsoleChangeList(ChangeList):
    """Django's list, with the date hierarchy's year, month and day in the query string
    checked: one no date holds (``?created_at__year=99999999999999999999``, or 9999,
    whose next year is none) is a wrong lookup, answered as Django answers the others
    (the list without it, ``?e=1``). Django's own check catches ``ValueError`` alone;
    these raise ``OverflowError``, or fail after it (a 500)."""

    def get_filters(self, request: HttpRequest) -> Any:
        try:
            return super().get_filters(request)
        except (OverflowError, ValueError) as error:
            raise IncorrectLookupParameters(error) from error


def console_queryset(queryset: QuerySet[Any]) -> ConsoleQuerySet:
    """``queryset`` as a :class:`ConsoleQuerySet` (the same query, database and hints)."""
    return ConsoleQuerySet(model=queryset.model, query=queryset.query.chain(), using=queryset.db)


def period_of(instant: datetime, kind: str) -> datetime:
    """The start of the year, month or day holding ``instant``, in its time zone."""
    day = instant.date()
    first = {"year": date(day.year, 1, 1), "month": day.replace(day=1), "day": day}[kind]
    return datetime(first.year, first.month, first.day, tzinfo=instant.tzinfo)


def next_period(period: datetime, kind: str) -> datetime:
    """The start of the year, month or day after the one starting at ``period``."""
    day = period.date()
    if kind == "year":
        following = date(day.year + 1, 1, 1)
    elif kind == "month":
        following = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
    else:
        following = day + timedelta(days=1)
    return datetime(following.year, following.month, following.day, tzinfo=period.tzinfo)


class BoundedPaginator(Paginator):  # type: ignore[type-arg]
    """Django's paginator, whose count reads at most :data:`EXACT_UP_TO` + 1 rows (in
    the list's own order, so through the index that serves the page). Past that, on
    PostgreSQL, the count is the planner's estimate of the matching rows and
    :attr:`estimated` is true (the page says "about"); other databases count them all.
    A page past the real end, reached through an estimate too high, is empty."""

    estimated = False
    exact_up_to = EXACT_UP_TO

    @cached_property
    def count(self) -> int:
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        exact: int = rows[: EXACT_UP_TO + 1].count()
        if exact <= EXACT_UP_TO:
            return exact
        if connections[rows.db].vendor != "postgresql":
            return int(rows.count())
        self.estimated = True
        return max(exact, planned_rows(rows))


def planned_rows(rows: QuerySet[Any]) -> int:
    """How many rows the planner expects ``rows`` to return (``EXPLAIN``: nothing runs)."""
    sql, params = rows.query.sql_with_params()
    with connections[rows.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def search(
    runs: QuerySet[Any],
    text: str,
    *,
    task_names: Callable[[], Iterable[str]],
    runs_of_key: Callable[[str], Sequence[int]],
    finds: Callable[[Q], bool],
) -> QuerySet[Any]:
    """The runs ``text`` finds: a task id starting with it (a whole id, or the short
    one the list shows), an exact root id, parent id or effect key, or a task name
    containing it (case ignored).

    Each kind is looked up first (the names among the distinct ones, ``task_names``;
    the key among the effects, ``runs_of_key``; each id by one probe of its index,
    ``finds``), and only the kinds that find something are asked of the list: one
    condition is read from its index in the list's order (a page of a common task's
    runs costs what a rare one's does), several are one ``OR`` of index conditions;
    never a join, nor ``DISTINCT``. A term longer than the id column
    (:data:`LONGEST_ID`) is looked for as a whole task id, not as the start of one:
    no longer id is kept (SQLite refuses a ``LIKE`` pattern of 50,000 bytes)."""
    term = typed_id(text)
    if not term:
        return runs
    task_id = Q(task_id__startswith=term) if len(term) <= LONGEST_ID else Q(task_id=term)
    found = [
        condition for condition in (task_id, Q(root_id=term), Q(parent_id=term)) if finds(condition)
    ]
    wanted = term.casefold()
    names = [name for name in task_names() if wanted in name.casefold()]
    if names:
        found.append(Q(task_name=names[0]) if len(names) == 1 else Q(task_name__in=names))
    keyed = list(runs_of_key(term))
    if keyed:
        found.append(Q(pk__in=keyed))
    if not found:
        return runs.none()
    either = found[0]
    for condition in found[1:]:
        either |= condition
    return runs.filter(either)
