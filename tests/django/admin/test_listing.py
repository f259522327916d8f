"""The list's index-backed answers are Django's answers: the date hierarchy's periods
found one index probe each equal ``QuerySet.datetimes`` (in UTC and in a zone with
daylight saving), the bounded count counts exactly below its bound, and a search's
kinds of id each find their run (SQLite here; the plans are held on PostgreSQL by
test_listing_query_plans.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
from django.utils import timezone

from celery_deadlines.admin.listing import BoundedPaginator, console_queryset
from celery_deadlines.ledger.sql.connection import Store
from celery_deadlines.models import Run
from tests.django.admin.test_runs import record

pytestmark = pytest.mark.django_db(transaction=True)

#: Instants around the edges the periods meet: a new year, a month's end, the nights
#: Berlin's clocks go forward and back.
INSTANTS = [
    datetime(2025, 12, 31, 22, 30, tzinfo=UTC),  # 23:30 in Berlin, 2025
    datetime(2025, 12, 31, 23, 30, tzinfo=UTC),  # 00:30 in Berlin, 2026
    datetime(2026, 1, 31, 23, 59, tzinfo=UTC),
    datetime(2026, 3, 29, 0, 59, tzinfo=UTC),  # 01:59 CET, before the clocks go forward
    datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # 03:00 CEST
    datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first of two
    datetime(2026, 10, 25, 1, 30, tzinfo=UTC),  # 02:30 CET, the second
    datetime(2026, 10, 26, 12, 0, tzinfo=UTC),
]


@pytest.fixture
def runs() -> None:
    store = Store()
    for index, at in enumerate(INSTANTS):
        record(store, f"dated-{index}")
        Run.objects.filter(task_id=f"dated-{index}").update(created_at=at)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
@pytest.mark.parametrize("kind", ["year", "month", "day"])
def test_the_periods_found_by_index_probes_are_djangos_periods(
    runs: None, zone: str, kind: Literal["year", "month", "day"]
) -> None:
    with timezone.override(zone):
        django = list(Run.objects.datetimes("created_at", kind))
        probed = console_queryset(Run.objects.all()).datetimes("created_at", kind)
        assert probed == django
        assert (
            console_queryset(Run.objects.all()).datetimes("created_at", kind, "DESC")
            == (django[::-1])
        )
        late = Run.objects.filter(created_at__gte=INSTANTS[3])
        assert console_queryset(late).datetimes("created_at", kind) == list(
            late.datetimes("created_at", kind)
        )


def test_the_bounded_count_is_exact_below_its_bound(runs: None) -> None:
    paginator = BoundedPaginator(Run.objects.order_by("-created_at", "-id"), 3)
    assert paginator.count == len(INSTANTS)
    assert not paginator.estimated
    assert paginator.num_pages == 3
    assert [r.task_id for r in paginator.page(3).object_list] == ["dated-1", "dated-0"]


def test_an_hour_after_the_last_run_there_is_no_later_period(runs: None) -> None:
    later = Run.objects.filter(created_at__gte=INSTANTS[-1] + timedelta(hours=1))
    assert console_queryset(later).datetimes("created_at", "day") == []
