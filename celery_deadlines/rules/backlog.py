"""The enqueue gate's second rule: a message the queue ahead of it cannot reach in time.

A publish is refused with ``queue_backlog`` when the messages waiting in its queue,
taken off at the rate the queue was seen served, would keep it waiting past its last
start (the deadline less the reserve): the claim gate would refuse it anyway, after a
worker fetched it, and its caller would learn it near its deadline. Refused at the
door, it costs no worker anything and its caller knows at once.

Under sustained overload (:data:`OVERLOAD` times what is served offered, and more) the
excess cannot finish whichever messages it is: the rule then also refuses a message
that would wait more than :data:`SHED` of its budget, so that the queue stays short and
the work that is admitted starts soon, while the pool is never left without work (the
queue is kept, only shorter). Below that load nothing that would start in time is
refused.

A queue is judged at the best rate it was measured served at within :data:`MEMORY`
(:func:`at_best`), never at a moment's slower one: a worker paused or restarting for a
while, or slowed by its machine, serves at that rate again once it is back, and what
waits behind it then starts in time.

What is observed (:class:`Sample`, one per reading of the broker's queue by the
publishing process: :mod:`celery_deadlines.core.backlog`) is the broker's own list:
its length, and how many messages were taken off it and pushed onto it since the
previous reading; and, when the queue's workers report it
(:mod:`celery_deadlines.core.workload`), the messages they hold not yet started (a
worker prefetches: they wait there, where the broker does not see them) and how many
they received and started since. With reports, a message waits behind the queue's
messages and the held ones, at the rate bodies were started: a message the claim gate
refused was taken off the queue but served nothing, and is not counted as service.
The rule refuses only on that evidence, and never when it is missing, stale, thin or
says the queue is not served (:func:`estimate` returns ``None``): a wrong or stale
estimate makes the gate let a message through, to be judged by the claim gate as
before, never refuse one that would have started.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

from .gates import Decision, Gate, Reason

#: Samples older than this (seconds) say nothing about the queue now.
STALE: Final = 0.5
#: The rate is measured over at least this long (seconds) of samples, at most WINDOW.
SPAN: Final = 0.25
WINDOW: Final = 1.0
#: Offered over served above this is overload, judged over at least OVERLOAD_SPAN
#: seconds: a worker slowed for a moment by its machine lowers a second's rate by a
#: fifth and more, and a load the pool serves must never be read as overload.
OVERLOAD: Final = 1.5
OVERLOAD_SPAN: Final = 0.75
#: Under overload, the longest wait admitted, as a share of the message's budget.
SHED: Final = 0.1
#: How long (seconds) the best rate a queue was measured served at is what it is judged
#: by (:func:`at_best`): workers slowed for a moment (paused, restarting, on a busy
#: machine) serve it at that rate again once they are back, and a moment's rate must not
#: refuse what would then start in time. A lasting slowdown is the claim gate's to
#: judge, as before this rule.
MEMORY: Final = 30.0
#: Workers' reports cover a queue when what they received is at least this share of
#: what the broker says was taken off it, less what is taken off in :data:`LAG` (a
#: report is written every 0.1 s, and read up to 50 ms later): a consumer that does
#: not report (an older version of this library) would otherwise leave its starts out
#: of the rate.
COVERED: Final = 0.8
LAG: Final = 0.15


class Sample(NamedTuple):
    """One reading of a queue: at ``at`` (monotonic seconds), ``depth`` messages were
    waiting; since the previous reading ``taken`` were taken off and ``pushed`` pushed
    on (``None``: not known, the queue was empty or emptied past what was last seen);
    the publishing process had tried ``tried`` publishes to it and had ``refused`` of
    them (counts since it started watching). When the queue's workers report
    (``None``: none does, lately): ``held`` messages they hold not yet started, and
    since the previous reading ``received`` taken off the queue and ``started``
    bodies begun, by the workers that reported at both readings."""

    at: float
    depth: int
    taken: int | None
    pushed: int | None
    tried: int
    refused: int
    held: int | None = None
    received: int | None = None
    started: int | None = None


class Backlog(NamedTuple):
    """What the samples say: ``depth`` messages waiting, taken off at ``rate`` per
    second while the queue waited for ``span`` seconds, while ``offered`` per second
    were published to it (those this rule refused included); ``wait``: how long a
    message published now waits behind them, ``depth / rate`` seconds. ``measured``:
    the rate the samples showed, when ``rate`` is a better one measured before
    (:func:`at_best`). ``held``: of the ``depth``, those the workers hold (``None``:
    no worker reports; ``rate`` is then what was taken off the queue, not started)."""

    depth: int
    rate: float
    offered: float
    span: float
    measured: float | None = None
    held: int | None = None

    @property
    def wait(self) -> float:
        return self.depth / self.rate

    @property
    def overloaded(self) -> bool:
        return self.span >= OVERLOAD_SPAN and self.offered > OVERLOAD * self.rate


def estimate(samples: Sequence[Sample], now: float) -> Backlog | None:
    """The backlog the newest samples show at monotonic instant ``now`` (the rate
    measured over :data:`WINDOW` at most of the last two, while the queue waited), or
    ``None`` when they cannot show one: the newest is stale or empty; less than
    :data:`SPAN` was measured while the queue waited (it keeps up, or it just began to
    wait); nothing was taken off (no worker serves it now: the claim gate decides).
    Judged by the workers' reports when they cover the queue (:func:`_reported`), else
    by the broker's list alone."""
    if len(samples) < 2:
        return None
    newest = samples[-1]
    if now - newest.at > STALE:
        return None
    if newest.held is not None:
        reported = _reported(samples)
        if not isinstance(reported, _Uncovered):
            return reported
    if newest.depth <= 0:
        return None
    taken = pushed = 0
    span = 0.0
    first = newest
    for later, earlier in zip(reversed(samples), reversed(samples[:-1]), strict=False):
        if newest.at - earlier.at > 2 * WINDOW:
            break
        first = earlier
        # a pair whose earlier newest message was still queued at the later reading
        # (``taken`` known): the queue never emptied between them, so what was taken
        # off is what the workers served (a pair where it emptied says only that the
        # workers kept up: it is left out)
        if later.taken is None or later.pushed is None or earlier.depth <= 0:
            continue
        taken += later.taken
        pushed += later.pushed
        span += later.at - earlier.at
        if span >= WINDOW:
            break
    if span < SPAN or taken <= 0:
        return None
    # offered: what every publisher pushed, and what this one was refused (not pushed)
    offered = (pushed + newest.refused - first.refused) / span
    return Backlog(newest.depth, taken / span, offered, span)


class _Uncovered:
    """Workers reported, but not for every consumer of the queue."""


_UNCOVERED: Final = _Uncovered()


def _reported(samples: Sequence[Sample]) -> Backlog | _Uncovered | None:
    """The backlog by the workers' reports: the queue's messages and those the workers
    hold wait, at the rate bodies were started over pairs of readings at which
    something waited (the workers had work all along). What was pushed is what the
    queue grew by and what the workers received. :data:`_UNCOVERED` when the workers
    received less than :data:`COVERED` of what the broker says was taken off."""
    newest = samples[-1]
    assert newest.held is not None
    ahead = newest.depth + newest.held
    started = pushed = taken = received = 0
    span = checked = 0.0
    first = newest
    for later, earlier in zip(reversed(samples), reversed(samples[:-1]), strict=False):
        if newest.at - earlier.at > 2 * WINDOW:
            break
        first = earlier
        if later.started is None or later.received is None or earlier.held is None:
            continue
        assert later.held is not None
        if earlier.depth + earlier.held <= 0 or later.depth + later.held <= 0:
            continue  # the workers may have waited for work: not a measure of service
        started += later.started
        pushed += later.depth - earlier.depth + later.received
        if later.taken is not None:
            taken += later.taken
            received += later.received
            checked += later.at - earlier.at
        span += later.at - earlier.at
        if span >= WINDOW:
            break
    if taken > 0 and received < COVERED * taken - taken / checked * LAG:
        return _UNCOVERED
    if ahead <= 0 or span < SPAN or started <= 0:
        return None
    offered = (max(pushed, 0) + newest.refused - first.refused) / span
    return Backlog(ahead, started / span, offered, span, held=newest.held)


class Best(NamedTuple):
    """The best rate a queue was measured served at, and the monotonic instant."""

    rate: float
    at: float


def remember(best: Best | None, backlog: Backlog | None, now: float) -> Best | None:
    """The best rate kept after a reading at monotonic instant ``now`` that showed
    ``backlog``: its rate if it is the best within :data:`MEMORY`, else the one kept."""
    if best is not None and now - best.at > MEMORY:
        best = None
    if backlog is not None and (best is None or backlog.rate >= best.rate):
        return Best(backlog.rate, now)
    return best


def at_best(backlog: Backlog | None, best: Best | None) -> Backlog | None:
    """``backlog`` judged at the best rate measured within :data:`MEMORY` (``best``,
    from :func:`remember`), when that is better than the rate it shows."""
    if backlog is None or best is None or best.rate <= backlog.rate:
        return backlog
    return backlog._replace(rate=best.rate, measured=backlog.rate)


def admit(
    backlog: Backlog | None, deadline: datetime, now: datetime, reserve: timedelta
) -> Decision | None:
    """The refusal of a message that must start by ``deadline - reserve`` published at
    ``now`` behind ``backlog``, with its arithmetic; ``None``: admitted."""
    if backlog is None:
        return None
    wait = backlog.wait
    left = (deadline - reserve - now).total_seconds()
    served = (
        f"measured over {backlog.span:.2f} s"
        if backlog.measured is None
        else f"its best within {MEMORY:g} s; {backlog.measured:.1f}/s over the last "
        f"{backlog.span:.2f} s"
    )
    if backlog.held is None:
        ahead = f"{backlog.depth} messages ahead in its queue, taken off at "
    else:
        ahead = (
            f"{backlog.depth} messages ahead ({backlog.depth - backlog.held} in its queue, "
            f"{backlog.held} held by its workers), started at "
        )
    ahead += f"{backlog.rate:.1f}/s ({served}): a wait of {wait:.3f} s"
    if wait > left:
        detail = (
            f"{ahead}, more than the {max(left, 0.0):.3f} s left before its last start "
            f"(the deadline less the reserve of {reserve.total_seconds():.3f} s)"
        )
    elif backlog.overloaded and wait > SHED * (deadline - now).total_seconds():
        detail = (
            f"{ahead}, more than {SHED:.0%} of the {(deadline - now).total_seconds():.3f} s "
            f"budget left, while {backlog.offered:.1f}/s were offered: more than "
            f"{OVERLOAD:g} x what is served, so the excess cannot start in time and is "
            "refused before it queues"
        )
    else:
        return None
    return Decision(Gate.ENQUEUE, Reason.QUEUE_BACKLOG, deadline, now, deadline - now, detail)


#: The most workers' reports read for one queue: a hash with more is not judged by.
MOST_REPORTS: Final = 1024
#: A report's value: ``seq held received started``, each a count (``seq`` grows with
#: every report a worker writes, so that a publisher judges it fresh by its own clock).
_REPORT: Final = re.compile(rb"(\d{1,15}) (\d{1,15}) (\d{1,15}) (\d{1,15})")


class Seen(NamedTuple):
    """A worker's report as a publisher last read it: its counts (``seq``, ``held``,
    ``received``, ``started``), the monotonic instant its ``seq`` was last seen to
    change, and whether it was (a report seen once is not yet known to be alive)."""

    counts: tuple[int, int, int, int]
    changed_at: float
    alive: bool


class Reports(NamedTuple):
    """What the fresh reports of a queue's workers say at one reading: ``held`` in all,
    and ``received`` and ``started`` since the previous reading, by ``workers``
    workers."""

    held: int
    received: int
    started: int
    workers: int = 1


def read_reports(
    raw: Mapping[Any, Any], seen: Mapping[bytes, Seen], now: float
) -> tuple[Reports | None, dict[bytes, Seen]]:
    """The reports ``raw`` (a queue's hash, read at monotonic instant ``now``: field a
    worker, value its counts) judged against those ``seen`` at the previous reading,
    and what is seen now. A report counts when its ``seq`` changed since it was first
    seen and within :data:`STALE` (a worker stopped, or gone, no longer reports); its
    received and started count from the previous reading when its ``seq`` grew and no
    count fell (a worker restarted under the same name starts again). A value that is
    not four counts, or holds more than it received and did not start, is not read;
    ``None``: no report counts."""
    if len(raw) > MOST_REPORTS:
        return None, {}
    now_seen: dict[bytes, Seen] = {}
    held = received = started = workers = 0
    for field, value in raw.items():
        match = _REPORT.fullmatch(value) if isinstance(value, bytes) else None
        if match is None or not isinstance(field, bytes):
            continue
        counts = (int(match[1]), int(match[2]), int(match[3]), int(match[4]))
        if counts[1] > counts[2] - counts[3]:
            continue  # it holds more than it received and did not start: not a count
        before = seen.get(field)
        if before is None:
            now_seen[field] = Seen(counts, now, alive=False)
            continue
        if counts[0] == before.counts[0]:
            now_seen[field] = before
        elif counts[0] > before.counts[0] and all(
            a >= b for a, b in zip(counts[2:], before.counts[2:], strict=True)
        ):
            now_seen[field] = Seen(counts, now, alive=True)
            received += counts[2] - before.counts[2]
            started += counts[3] - before.counts[3]
        else:
            now_seen[field] = Seen(counts, now, alive=False)  # started again
        current = now_seen[field]
        if current.alive and now - current.changed_at <= STALE:
            held += counts[1]
            workers += 1
    return (Reports(held, received, started, workers) if workers else None), now_seen
