"""httpx calls under the current deadline: a request hook for ``httpx.Client`` and one
for ``httpx.AsyncClient`` (``pip install 'celery-deadlines[httpx]'``).

::

    client = httpx.Client(event_hooks={"request": [DeadlineHook()]})
    client = httpx.AsyncClient(event_hooks={"request": [AsyncDeadlineHook()]})

Every request the client sends passes the outbound gate (:func:`celery_deadlines.outbound.prepare`)
first: each redirect and each request of an auth flow, whatever transport, mount or proxy
sends it (a hook, not a transport: httpx sends through a proxy's own transport, read
from the environment, past a transport the client was given). Without a deadline the
request is sent as written. With one, it is refused before a connection is opened
(:class:`DeadlineRefused`, gate ``outbound``), or sent with the deadline's headers
(replacing any of the same name) and its timeouts capped.

httpx's timeout is per phase (``connect``, ``write``, ``read``, ``pool``). Each is the
caller's own, at most what is left of the call when that phase starts: httpcore reads
the request's timeouts at each network operation, and is given the time left then. So
the whole call, a streamed body read later included, ends by the deadline less the
reserve, with the client's own timeout error (``httpx.ConnectTimeout``,
``httpx.ReadTimeout``, ...), however slowly the service answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import httpx

from .outbound import OutboundCall, prepare
from .rules.budgets import DurationLike, parse_duration

__all__ = ["AsyncDeadlineHook", "DeadlineHook"]

#: The phases of httpx's timeout, as httpcore reads them from the request.
PHASES: Final = ("connect", "read", "write", "pool")


class _CappedTimeouts(dict[str, float | None]):
    """The request's ``timeout`` extension, each phase read as the caller's own timeout
    capped at what is left of the call at that moment. Its items, for anything that
    copies it, are the caps as of the call's admission."""

    def __init__(self, own: Mapping[str, Any], call: OutboundCall) -> None:
        self.own = {phase: own.get(phase) for phase in PHASES}
        self.call = call
        super().__init__({**own, **{phase: call.cap(self.own[phase]) for phase in PHASES}})

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.own:
            return self.call.cap(self.own[key])
        return super().get(key, default)

    def __getitem__(self, key: str) -> float | None:
        if key in self.own:
            return self.call.cap(self.own[key])
        return super().__getitem__(key)


def target_of(request: httpx.Request) -> str:
    """The call's method and host (no path, no query: a log line and a metrics label)."""
    port = request.url.port
    return f"{request.method} {request.url.host}" + (f":{port}" if port else "")


class _Hook:
    def __init__(self, *, reserve: DurationLike | None = None, app: Any = None) -> None:
        """``reserve``: what the call leaves its caller (default
        ``deadlines_outbound_reserve``); ``app``: the Celery app whose settings apply
        (default: the running task's, or the current one)."""
        # checked here: a bad reserve fails where the client is made, not at a call
        self.reserve = (
            None if reserve is None else parse_duration(reserve, name="reserve", allow_zero=True)
        )
        self.app = app

    def admit(self, request: httpx.Request) -> None:
        """Pass ``request`` through the outbound gate (raises :class:`DeadlineRefused`)."""
        call = prepare(target_of(request), reserve=self.reserve, app=self.app)
        if call is None:
            return
        for name, value in call.headers.items():
            request.headers[name] = value  # our deadline, never a caller's
        own = request.extensions.get("timeout") or {}
        if isinstance(own, _CappedTimeouts):  # a redirect of a call admitted before
            own = own.own
        request.extensions["timeout"] = _CappedTimeouts(own, call)


class DeadlineHook(_Hook):
    """A request hook for ``httpx.Client``: the outbound gate, the deadline's headers
    and the capped timeouts (see the module's docstring)."""

    def __call__(self, request: httpx.Request) -> None:
        self.admit(request)


class AsyncDeadlineHook(_Hook):
    """The same for ``httpx.AsyncClient`` (whose hooks are awaited)."""

    async def __call__(self, request: httpx.Request) -> None:
        self.admit(request)
