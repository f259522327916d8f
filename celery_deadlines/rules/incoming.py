"""Pure rules for a deadline that starts at an incoming request (no clock, no I/O).

A request's deadline is its view's **budget** (from ``now``), optionally shortened by a
deadline an upstream caller sent in a header. Three header syntaxes are understood:

* ``grpc-timeout`` (``grpc-timeout: 250m``): time left, 1 to 8 digits and a unit, ``H``
  hours, ``M`` minutes, ``S`` seconds, ``m`` milliseconds, ``u`` microseconds, ``n``
  nanoseconds (gRPC over HTTP/2);
* ``milliseconds`` (``X-Request-Timeout-Ms: 1500``): time left, whole milliseconds;
* ``rfc3339`` (``X-Request-Deadline: 2026-12-01T10:00:00.250Z``): an absolute instant
  with its UTC offset.

Security first, in :func:`decide`: a header is read only from a trusted peer; it can
only shorten the budget, never extend it nor create a deadline where the view has no
budget; a malformed value, or one further than the horizon (``deadlines_max_budget``)
from ``now`` in either direction (a unit or clock error), is ignored with its reason.
Nothing here raises for a header: what cannot be used is reported in
:attr:`Decision.ignored`.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Literal, NamedTuple, TypeAlias, get_args

from ..errors import InvalidDeadline
from .budgets import UNSET, Unset, parse_budget
from .quoting import shown
from .wire import in_utc

Syntax = Literal["grpc-timeout", "milliseconds", "rfc3339"]
SYNTAXES: Final[tuple[Syntax, ...]] = get_args(Syntax)

#: Why a header was not used.
#: ``untrusted``: the peer is not a trusted proxy (the value is not even parsed);
#: ``malformed``: not the header's syntax; ``absurd``: further than the horizon from now;
#: ``later``: not before the budget's own deadline (a header can only shorten it).
Why = Literal["untrusted", "malformed", "absurd", "later"]

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Longest header value parsed (a longer one is malformed, and shown cut in the log).
MAX_VALUE_LENGTH: Final = 64
_SHOWN: Final = 40

_GRPC_TIMEOUT: Final = re.compile(r"([0-9]{1,8})([HMSmun])")
_GRPC_UNITS: Final = {
    "H": timedelta(hours=1),
    "M": timedelta(minutes=1),
    "S": timedelta(seconds=1),
    "m": timedelta(milliseconds=1),
    "u": timedelta(microseconds=1),
}
_MILLISECONDS: Final = re.compile(r"[0-9]+")
_RFC3339: Final = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?:\.([0-9]{1,9}))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


# -- the three syntaxes ------------------------------------------------------------------------


def parse_grpc_timeout(value: str) -> timedelta:
    """A ``grpc-timeout`` value as a duration, or :class:`InvalidDeadline`."""
    match = _GRPC_TIMEOUT.fullmatch(value)
    if match is None:
        raise InvalidDeadline("not 1 to 8 digits followed by one of H M S m u n")
    digits, unit = int(match[1]), match[2]
    if unit == "n":  # below timedelta's resolution: whole microseconds, rounded down
        return timedelta(microseconds=digits // 1000)
    return digits * _GRPC_UNITS[unit]


def parse_milliseconds(value: str) -> int:
    """A relative timeout in whole milliseconds (as an int: it may be too large for a
    timedelta), or :class:`InvalidDeadline`."""
    if _MILLISECONDS.fullmatch(value) is None:
        raise InvalidDeadline("not a whole number of milliseconds")
    return int(value)


def parse_rfc3339(value: str) -> datetime:
    """An RFC 3339 date-time with its offset (``Z`` or ``+hh:mm``), as an aware UTC
    instant, or :class:`InvalidDeadline` (a naive or partial one is refused)."""
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise InvalidDeadline("not an RFC 3339 date-time with a UTC offset")
    whole, fraction, offset = match[1], match[2] or "0", match[3]
    micro = fraction[:6].ljust(6, "0")  # nanoseconds: cut to timedelta's resolution
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        instant = datetime.fromisoformat(f"{whole.upper()}.{micro}{offset}")
    except ValueError as exc:  # 2026-02-30, 25:00, a leap second
        raise InvalidDeadline(f"not a valid date-time: {exc}") from exc
    return in_utc(instant, "the date-time")


# -- the decision -----------------------------------------------------------------------------


class Ignored(NamedTuple):
    """A header that did not set the deadline, and why (``shown``: its value, cut)."""

    header: str
    shown: str
    why: Why
    detail: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The deadline a request's work runs under, where it came from, and every header
    that was not used. ``deadline`` is ``None`` when the request has no budget."""

    deadline: datetime | None
    source: str | None
    ignored: tuple[Ignored, ...] = field(default=())

    def remaining(self, now: datetime) -> timedelta | None:
        """Time left at ``now`` (negative once past), ``None`` without a deadline."""
        return None if self.deadline is None else self.deadline - now


def show(value: str) -> str:
    """A header value fit for a log line: its ``repr``, cut (it comes from outside)."""
    return shown(value, _SHOWN)


class Unusable(NamedTuple):
    """Why a header's value cannot be used (``malformed`` or ``absurd``) and the detail."""

    why: Why
    detail: str


def header_instant(
    syntax: Syntax, value: str, *, now: datetime, horizon: timedelta
) -> datetime | Unusable:
    """The instant a header's value names, or why it cannot be used."""
    if len(value) > MAX_VALUE_LENGTH:
        return Unusable("malformed", f"longer than {MAX_VALUE_LENGTH} characters")
    text = value.strip(" \t")
    try:
        if syntax == "rfc3339":
            instant = parse_rfc3339(text)
            if abs(instant - now) > horizon:
                detail = (
                    f"{instant.isoformat()} is more than {horizon} from the clock reading "
                    f"{now.isoformat()}"
                )
                return Unusable("absurd", detail)
            return instant
        if syntax == "grpc-timeout":
            span = parse_grpc_timeout(text)
        else:
            milliseconds = parse_milliseconds(text)
            if milliseconds > horizon // timedelta(milliseconds=1):
                return Unusable("absurd", f"{milliseconds} ms is more than {horizon}")
            span = timedelta(milliseconds=milliseconds)
    except InvalidDeadline as exc:
        return Unusable("malformed", str(exc))
    if span > horizon:
        return Unusable("absurd", f"{span} is more than {horizon}")
    return now + span


def decide(
    *,
    now: datetime,
    budget: timedelta | None,
    budget_source: str,
    headers: Mapping[str, str],
    honoured: Mapping[str, Syntax],
    trusted: bool,
    horizon: timedelta,
) -> Decision:
    """The deadline of a request that arrived at ``now``.

    ``budget`` is the view's own (``None``: no deadline, and no header makes one);
    ``headers`` the request's, their names lower case; ``honoured`` the headers that may
    shorten the budget, by lower-case name, with their syntax; ``trusted`` whether the
    peer is a trusted proxy. The earliest usable header before ``now + budget`` wins.
    """
    if budget is None:
        return Decision(None, None)
    deadline, source = now + budget, budget_source
    ignored: list[Ignored] = []
    for name, syntax in honoured.items():
        value = headers.get(name)
        if value is None:
            continue
        if not trusted:
            ignored.append(Ignored(name, show(value), "untrusted", "the peer is not trusted"))
            continue
        instant = header_instant(syntax, value, now=now, horizon=horizon)
        if isinstance(instant, Unusable):
            ignored.append(Ignored(name, show(value), *instant))
            continue
        if instant >= deadline:
            detail = f"{instant.isoformat()} is not before {deadline.isoformat()} ({source})"
            ignored.append(Ignored(name, show(value), "later", detail))
            continue
        deadline, source = instant, f"header {name}"
    return Decision(deadline, source, tuple(ignored))


# -- trust ----------------------------------------------------------------------------------


def is_trusted(peer: str | None, networks: Iterable[Network]) -> bool:
    """Whether ``peer`` (an address as the server saw it: REMOTE_ADDR) is in one of
    ``networks``. No address, or one that is not an IP address, is never trusted."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])  # an IPv6 zone aside
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


# -- settings' values (conf.py checks them with these) -------------------------------------


def parse_networks(value: object, *, name: str) -> tuple[Network, ...]:
    """A list of addresses or CIDR networks (``"10.0.0.0/8"``, ``"::1"``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidDeadline(
            f"{name} must be a list of addresses or networks, got {type(value).__name__} "
            f"{shown(value)}"
        )
    networks = []
    for entry in value:
        if not isinstance(entry, str):
            raise InvalidDeadline(f"{name} entries must be strings, got {shown(entry)}")
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise InvalidDeadline(f"{name}: {shown(entry)} is not an address or network") from exc
    return tuple(networks)


def parse_header_name(value: object, *, name: str) -> str:
    """An HTTP header name (a token), lower case."""
    if not isinstance(value, str) or _TOKEN.fullmatch(value) is None:
        raise InvalidDeadline(f"{name} must be an HTTP header name, got {shown(value)}")
    return value.lower()


def parse_honoured(value: object, *, name: str) -> dict[str, Syntax]:
    """``{header name: syntax}``, names lower case."""
    if not isinstance(value, Mapping):
        raise InvalidDeadline(
            f"{name} must map header names to a syntax ({', '.join(SYNTAXES)}), "
            f"got {type(value).__name__}"
        )
    honoured: dict[str, Syntax] = {}
    for header, syntax in value.items():
        lower = parse_header_name(header, name=f"{name} key")
        if syntax not in SYNTAXES:
            raise InvalidDeadline(
                f"{name}[{shown(header)}] must be one of {', '.join(SYNTAXES)}, got {shown(syntax)}"
            )
        honoured[lower] = syntax
    return honoured


@dataclass(frozen=True, slots=True)
class RequestBudgets:
    """Budgets by URL name (as ``reverse()`` takes it, namespace included) and by path
    pattern (starting with ``/``; ``fnmatch`` wildcards), in the order written."""

    by_name: Mapping[str, timedelta | None] = field(default_factory=dict)
    by_pattern: tuple[tuple[str, timedelta | None], ...] = ()


def parse_request_budgets(value: object, *, name: str, maximum: timedelta) -> RequestBudgets:
    """``{URL name or "/path/pattern*": budget or None}``."""
    if not isinstance(value, Mapping):
        raise InvalidDeadline(
            f"{name} must map URL names or path patterns to budgets, got {type(value).__name__}"
        )
    by_name: dict[str, timedelta | None] = {}
    by_pattern: list[tuple[str, timedelta | None]] = []
    for key, raw in value.items():
        if not isinstance(key, str) or not key:
            raise InvalidDeadline(
                f"{name} keys must be URL names or path patterns, got {shown(key)}"
            )
        budget = parse_budget(raw, name=f"{name}[{shown(key)}]", maximum=maximum)
        if key.startswith("/"):
            fault = pattern_fault(key)
            if fault is not None:
                raise InvalidDeadline(f"{name}[{shown(key)}] is not a path pattern: {fault}")
            by_pattern.append((key, budget))
        else:
            by_name[key] = budget
    return RequestBudgets(by_name, tuple(by_pattern))


def pattern_fault(pattern: str) -> str | None:
    """What is wrong with an ``fnmatch`` path pattern, or ``None``. ``fnmatch`` refuses
    nothing: a ``[`` no ``]`` closes matches itself (``"/["`` matches only the path
    ``/[``), and a set of characters none is in (``[z-a]``) matches no path at all;
    either is a pattern written wrong."""
    at = pattern.find("[")
    while at >= 0:
        end = at + 1
        end += pattern.startswith("!", end)  # a negated set
        end += pattern.startswith("]", end)  # a "]" first is one of the set's
        end = pattern.find("]", end)
        if end < 0:
            return (
                f"its '[' at {at} opens a set of characters no ']' closes (write '[[]' for a '[')"
            )
        at = pattern.find("[", end + 1)
    if "(?!)" in fnmatch.translate(pattern):  # fnmatch's own "this set is empty"
        return "a set of characters in it holds none (a range backwards, as [z-a])"
    return None


def choose_budget(
    *,
    view: timedelta | Unset | None,
    view_name: str | None,
    path: str,
    budgets: RequestBudgets,
    default: timedelta | None,
) -> tuple[timedelta | None, str]:
    """A request's budget and where it came from. The first level that says anything
    wins (``None`` says "no deadline"): the view's decorator, its URL name, the first
    path pattern that matches, the default."""
    if view is not UNSET:
        return view, "view"
    if view_name is not None and view_name in budgets.by_name:
        return budgets.by_name[view_name], f"URL name {view_name}"
    for pattern, budget in budgets.by_pattern:
        if fnmatch.fnmatchcase(path, pattern):
            return budget, f"path pattern {pattern}"
    return default, "default request budget"
