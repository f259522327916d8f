"""Django's door to :func:`~celery_deadlines.core.ingress.ingress_scope`: every request is
handled under its deadline, and every task its view publishes inherits it.

::

    MIDDLEWARE = [
        "django.middleware.security.SecurityMiddleware",
        "celery_deadlines.middleware.DeadlineMiddleware",
        ...
    ]

The request's budget is the first of: the view's :func:`deadline_budget` decorator,
``CELERY_DEADLINES_REQUEST_BUDGETS`` by URL name, then by path pattern (in the order
written), ``CELERY_DEADLINES_REQUEST_BUDGET``. ``None`` at any level means no deadline;
a request with no budget opens no scope at all. The middleware resolves the URL itself
(``request.urlconf`` if a middleware before it set one), so that the scope is a ``with``
block around the rest of the chain and the view, the same in WSGI and ASGI, for sync and
async views (a sync view under ASGI runs in a copy of the context: it inherits too).

A view reads the deadline in force as ``request.deadline_decision`` (set on every
request, with or without a budget): the :class:`~celery_deadlines.rules.incoming.Decision`
``ingress_scope`` yields, its ``deadline`` (``None``: no scope), ``source``, ``ignored``
headers and ``remaining(now)``.

Settings are read from Django's settings (``CELERY_DEADLINES_*``), whichever Celery app
is loaded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, Final, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, resolve

from .clock import get_clock
from .conf import REMAINING_HEADER, REQUEST_BUDGET, REQUEST_BUDGETS, tracked
from .core import ingress
from .rules.budgets import UNSET, DurationLike, Unset, parse_duration
from .rules.incoming import Decision, choose_budget

V = TypeVar("V")

#: The attribute :func:`deadline_budget` sets on a view (or its class).
ATTRIBUTE: Final = "celery_deadlines_budget"
#: The request's attribute a view reads the decision in force from.
REQUEST_ATTRIBUTE: Final = "deadline_decision"


__all__ = ["DeadlineMiddleware", "deadline_budget"]


def deadline_budget(budget: DurationLike | None) -> Callable[[V], V]:
    """Give a view its request budget (seconds or a timedelta; ``None``: no deadline,
    whatever the settings say). Decorates a function view, sync or async, or a
    class-based view's class; the view itself is returned unchanged. A bad budget
    raises :class:`InvalidDeadline` at import."""
    span = None if budget is None else parse_duration(budget, name="deadline_budget")

    def mark(view: V) -> V:
        setattr(view, ATTRIBUTE, span)
        return view

    return mark


class _DjangoSettings(Mapping[str, Any]):
    """Django's ``CELERY_DEADLINES_*`` settings, by their Celery names."""

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(django_settings, f"CELERY_{name.upper()}")
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        prefix = "CELERY_DEADLINES_"
        return (n[7:].lower() for n in dir(django_settings) if n.startswith(prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: Read once per value, reloaded on ``setting_changed`` (``override_settings``).
_settings = tracked(_DjangoSettings())


def view_budget(request: HttpRequest) -> tuple[timedelta | None, str]:
    """The request's budget and where it came from (see the module's docstring)."""
    view: timedelta | Unset | None = UNSET
    view_name = None
    try:
        match = resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        match = None
    if match is not None:
        view_name = match.view_name
        func = match.func
        owner = getattr(func, "view_class", None)  # a class-based view's as_view()
        view = getattr(func, ATTRIBUTE, getattr(owner, ATTRIBUTE, UNSET))
    return choose_budget(
        view=view,
        view_name=view_name,
        path=request.path_info,
        budgets=_settings.get(REQUEST_BUDGETS),
        default=_settings.get(REQUEST_BUDGET),
    )


class DeadlineMiddleware:
    """Open the request's deadline scope around the rest of the chain (sync or async),
    and give the request the decision in force (``request.deadline_decision``).

    With ``CELERY_DEADLINES_REMAINING_HEADER`` set, the response carries that header:
    the whole milliseconds the request had left when its response was ready (0 once
    past), on responses of requests that had a deadline.
    """

    sync_capable = True
    async_capable = True

    def __init__(
        self,
        get_response: Callable[[HttpRequest], HttpResponseBase]
        | Callable[[HttpRequest], Awaitable[HttpResponseBase]],
    ) -> None:
        self.get_response: Callable[[HttpRequest], Any] = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        with self._scope(request) as decision:
            setattr(request, REQUEST_ATTRIBUTE, decision)
            return self._finish(self.get_response(request), decision)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        with self._scope(request) as decision:
            setattr(request, REQUEST_ATTRIBUTE, decision)
            return self._finish(await self.get_response(request), decision)

    def _scope(self, request: HttpRequest) -> AbstractContextManager[Decision]:
        budget, source = view_budget(request)
        decision = ingress.decide(
            request.headers,
            budget=budget,
            budget_source=source,
            settings=_settings,
            peer=request.META.get("REMOTE_ADDR"),
        )
        return ingress.scope_for(decision)

    def _finish(self, response: HttpResponseBase, decision: Decision) -> HttpResponseBase:
        header = _settings.get(REMAINING_HEADER)
        left = decision.remaining(get_clock().now())
        if header is not None and left is not None:
            response[header] = str(max(0, left // timedelta(milliseconds=1)))
        return response
