"""Every parser of headers, durations and settings, fuzzed: whatever it is given, only
the package's documented errors leave it (``InvalidDeadline``, ``ConfigurationError``),
an error repeats a bounded part of what it was given, and a decoded deadline never lies
further ahead than the maximum budget. And the message a worker's main process takes,
whatever its headers hold: only documented refusals, nothing raised into the consumer,
nothing stored under an id that cannot name a result, no metric label made of it.

``make test`` runs :data:`EXAMPLES` examples per property (a few thousand in all);
``make fuzz`` runs the opt-in tier, ``DEADLINES_FUZZ_EXAMPLES`` per property (10,000 by
default there, some 160,000 in all), in one process, and prints a summary line: the
examples run and the distinct exceptions the parsers raised.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from celery_deadlines import conf
from celery_deadlines.core.options import start_of
from celery_deadlines.errors import ConfigurationError, InvalidDeadline
from celery_deadlines.rules import incoming
from celery_deadlines.rules.budgets import LONGEST, parse_budget, parse_duration
from celery_deadlines.rules.contracts import parse_contracts
from celery_deadlines.rules.gates import retry_wait
from celery_deadlines.rules.retention import parse_age, parse_batch_size, parse_retention
from celery_deadlines.rules.stamping import Inherited, Own, read_headers, stamp_for
from celery_deadlines.rules.wire import decode, decode_occurrence, encode
from celery_deadlines.testing import FakeClock
from tests.support.summaries import leave

#: Examples per property: the env var's, else a few hundred (``make test``).
EXAMPLES: Final = int(os.environ.get("DEADLINES_FUZZ_EXAMPLES") or 250)
#: The longest message an error may have: what it repeats of a value is cut.
LONGEST_MESSAGE: Final = 1000

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
HORIZON = timedelta(days=7)

fuzz = settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,  # the tier explores afresh; failing seeds become @example(...)
)


class Tally:
    """What the fuzzing saw, for the summary line."""

    def __init__(self) -> None:
        self.examples = 0
        self.raised: Counter[str] = Counter()
        self.messages: set[str] = set()

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(self.raised.items()))
        return (
            f"fuzz: {self.examples} examples, {len(self.raised)} distinct exceptions "
            f"({kinds or 'none'}), {len(self.messages)} distinct messages"
        )


TALLY = Tally()


def only_documented_errors(call: Callable[[], Any], *allowed: type[Exception]) -> Any:
    """``call()``'s value, or ``None`` when it raised one of ``allowed`` with a bounded
    message; any other exception fails the property."""
    TALLY.examples += 1
    try:
        return call()
    except allowed as exc:
        TALLY.raised[type(exc).__name__] += 1
        TALLY.messages.add(str(exc)[:200])
        message = str(exc)
    assert len(message) <= LONGEST_MESSAGE, message[:LONGEST_MESSAGE]
    return None


# -- what an attacker or a careless user may write ------------------------------------------------

offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
instants = st.datetimes(timezones=st.one_of(st.none(), offsets))
iso_texts = st.one_of(
    instants.map(datetime.isoformat),
    st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]),
)
numbers = st.one_of(
    st.floats(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([1e308, -1e308, 1e-300, 1e-9, 10**400, 2**63, -0.0]),
)
durations = st.one_of(numbers, st.timedeltas(), st.none(), st.booleans(), st.text(max_size=30))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(), iso_texts, st.binary())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=8,
)


# -- the deadline headers a worker reads -------------------------------------------------


@fuzz
@given(st.one_of(values, iso_texts, numbers))
@example("0001-01-01T00:00:00+01:00")
@example(10**400)
def test_a_deadline_header_decodes_to_a_utc_instant_within_the_horizon_or_is_invalid(
    value: object,
) -> None:
    instant = only_documented_errors(
        lambda: decode(value, now=NOW, horizon=HORIZON), InvalidDeadline
    )
    if instant is not None:
        assert instant.tzinfo == UTC
        assert instant - NOW <= HORIZON


@fuzz
@given(
    st.dictionaries(
        st.sampled_from(["x_deadline", "x_delivery_deadline", "x_deadline_origin"]), values
    )
)
def test_a_messages_headers_are_read_whatever_they_hold(headers: dict[str, Any]) -> None:
    carried = only_documented_errors(lambda: read_headers(headers, NOW, HORIZON, "t-1"))
    assert carried.deadline is None or carried.deadline - NOW <= HORIZON
    assert carried.delivery is None or carried.delivery - NOW <= HORIZON
    assert isinstance(carried.origin, str)


@fuzz
@given(values)
def test_an_occurrence_header_is_read_whatever_it_holds(header: object) -> None:
    occurrence = only_documented_errors(lambda: decode_occurrence({"at": header}))
    assert occurrence["not_before"] is None or occurrence["not_before"].tzinfo == UTC


@fuzz
@given(values)
def test_a_callers_expires_never_lengthens_the_deadline(expires: object) -> None:
    deadline = NOW + timedelta(seconds=30)
    own = Own(deadline, "task")
    stamp = only_documented_errors(
        lambda: stamp_for(own, Inherited(), now=NOW, expires=expires, task_id="t")
    )
    assert stamp.governed.deadline is not None
    assert stamp.governed.deadline <= deadline
    assert stamp.expires == stamp.governed.deadline


@fuzz
@given(numbers, numbers)
def test_a_countdown_is_a_start_or_a_clear_error(countdown: float, default: float) -> None:
    only_documented_errors(lambda: start_of({"countdown": countdown}, NOW), InvalidDeadline)
    wait = only_documented_errors(
        lambda: retry_wait(None, countdown, default, NOW), InvalidDeadline
    )
    assert wait is None or timedelta(0) <= wait <= LONGEST


# -- the headers a request brings --------------------------------------------------------


@fuzz
@given(
    st.sampled_from(incoming.SYNTAXES),
    st.one_of(st.text(), iso_texts, st.integers().map(str), st.from_regex(r"[0-9]{1,8}[HMSmun]")),
)
@example("rfc3339", "0001-01-01T00:00:00+01:00")
def test_a_request_header_is_an_instant_within_the_horizon_or_unusable(
    syntax: incoming.Syntax, value: str
) -> None:
    found = only_documented_errors(
        lambda: incoming.header_instant(syntax, value, now=NOW, horizon=HORIZON)
    )
    if not isinstance(found, incoming.Unusable):
        assert found.tzinfo is not None
        assert abs(found - NOW) <= HORIZON


@fuzz
@given(st.dictionaries(st.sampled_from(["grpc-timeout", "x-deadline"]), st.text()), st.booleans())
def test_a_requests_deadline_is_never_later_than_its_budget(
    headers: dict[str, str], trusted: bool
) -> None:
    decision = only_documented_errors(
        lambda: incoming.decide(
            now=NOW,
            budget=timedelta(seconds=10),
            budget_source="view",
            headers=headers,
            honoured={"grpc-timeout": "grpc-timeout", "x-deadline": "rfc3339"},
            trusted=trusted,
            horizon=HORIZON,
        )
    )
    assert decision.deadline <= NOW + timedelta(seconds=10)
    assert all(len(ignored.shown) <= 43 for ignored in decision.ignored)  # cut at 40


# -- durations and settings ---------------------------------------------------------------


@fuzz
@given(durations, st.booleans())
def test_a_duration_is_within_a_microsecond_and_a_century_or_invalid(
    value: object, allow_zero: bool
) -> None:
    duration = only_documented_errors(
        lambda: parse_duration(value, name="budget", allow_zero=allow_zero), InvalidDeadline
    )
    if duration is not None:
        assert timedelta(0) <= duration <= LONGEST
        assert duration > timedelta(0) or allow_zero
    budget = only_documented_errors(
        lambda: parse_budget(value, name="budget", maximum=HORIZON), InvalidDeadline
    )
    assert budget is None or timedelta(0) < budget <= HORIZON


@fuzz
@given(st.one_of(durations, st.text(alphabet="0123456789.PTWDHMSwdhms", max_size=20)))
@example("P99999999999999D")
@example("¹")  # str.isdigit() is true of it, int() refuses it (make fuzz, seed 1347795238)
@example("9" * 5000)  # more digits than int() reads (4,300)
def test_an_age_or_retention_is_a_duration_or_invalid(value: object) -> None:
    only_documented_errors(lambda: parse_age(value, name="--older-than"), InvalidDeadline)
    only_documented_errors(lambda: parse_retention(value, name="retention"), InvalidDeadline)
    only_documented_errors(lambda: parse_batch_size(value, name="--batch-size"), InvalidDeadline)


@fuzz
@given(values)
def test_request_settings_are_parsed_or_invalid(value: object) -> None:
    only_documented_errors(
        lambda: incoming.parse_request_budgets(value, name="budgets", maximum=HORIZON),
        InvalidDeadline,
    )
    only_documented_errors(lambda: incoming.parse_networks(value, name="proxies"), InvalidDeadline)
    only_documented_errors(lambda: incoming.parse_honoured(value, name="headers"), InvalidDeadline)
    only_documented_errors(
        lambda: incoming.parse_header_name(value, name="header"), InvalidDeadline
    )


@fuzz
@given(
    st.one_of(
        values,
        st.dictionaries(
            st.text(max_size=10),
            st.dictionaries(
                st.sampled_from(
                    [
                        "budget",
                        "reserve",
                        "attempt_timeout",
                        "lease_ttl",
                        "on_expiry",
                        "observation_ttl",
                    ]
                ),
                values,
            ),
        ),
    )
)
def test_contracts_are_parsed_or_invalid(value: object) -> None:
    only_documented_errors(
        lambda: parse_contracts(value, name="contracts", maximum=HORIZON), InvalidDeadline
    )


class Unreadable(dict):  # type: ignore[type-arg]
    """A mapping whose own methods fail, as a settings module can write one."""

    def items(self) -> Any:
        raise RuntimeError("items() failed")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ failed")


#: Values no parser may crash on, nor repeat whole: huge numbers (beyond a float, a
#: 32-bit column, Python's 4,300-digit str()), huge keys and strings, a list where a
#: string goes, patterns fnmatch reads as something else, a value whose methods fail.
BIG = "x" * 100_000
hostile = st.one_of(
    st.sampled_from(
        [
            ["default"],
            2**31,
            2**70,
            -(2**70),
            10**5000,
            BIG,
            BIG.encode(),
            {BIG: 1},
            {BIG: BIG},
            {"a": BIG},
            [BIG],
            {"/[": 1},
            {"/a[b]c[": 1},
            {"/[z-a]": 1},
            {1: 1},
            {("a",): 1},
            {BIG: {"budget": 1}},
            {BIG: "grpc-timeout"},
            "9" * 5000,
            Unreadable(a=1),
            float("nan"),
        ]
    ),
    st.integers(min_value=2**31 - 2, max_value=2**80),
    st.dictionaries(st.text(min_size=1, max_size=3).map(lambda key: key * 400), numbers),
)
#: The largest integer any setting may be: the ledger's 32-bit columns' (a count of
#: lost leases), a TCP port far below it.
LARGEST_SETTING: Final = 2**31 - 1


@fuzz
@given(st.sampled_from(conf.SETTINGS), st.one_of(values, hostile))
@example(conf.MAX_LOST_LEASES, 2**70)
@example(conf.REQUEST_BUDGETS, {"/[": 1})
@example(conf.DATABASE, ["default"])
@example(conf.BUDGETS, {BIG: 1})
def test_every_setting_is_its_value_or_a_configuration_error_naming_it(
    setting: conf.Setting[Any], value: object
) -> None:
    settings_ = conf.Settings({setting.name: value})
    parsed = only_documented_errors(lambda: settings_.get(setting), ConfigurationError)
    if isinstance(parsed, int):  # a number the code compares with a column, or binds
        assert parsed <= LARGEST_SETTING
    for error in settings_.check():  # an error of a setting read against it names that one
        assert any(other.name in str(error) for other in conf.SETTINGS)
        assert len(str(error)) <= LONGEST_MESSAGE
        if not isinstance(value, Unreadable):  # the parser's own words, never the catch-all
            assert isinstance(error.__cause__, InvalidDeadline), error.__cause__


# -- the messages a worker's main process takes ---------------------------------------------

#: What a DeadlineTask's message may be refused with in the worker's main process
#: (docs/explanation/clocks-and-gates.md, the claim gate); any other outcome is Celery's own.
MAIN_PROCESS_REFUSALS: Final = frozenset(
    {"invalid_message", "invalid_deadline", "deadline_passed", "insufficient_budget"}
)
#: The fake clock of the main-process property (after any real "now": Celery's own
#: checks, on the wall clock, never find its instants past).
FAKE_NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ABSENT = object()

# what kombu's JSON (Redis) and py-amqp's tables (RabbitMQ) decode a header to
header_values = st.one_of(
    values, instants, st.uuids(), st.decimals(allow_nan=True, allow_infinity=True)
)
near = st.floats(min_value=-100, max_value=100).map(lambda s: FAKE_NOW + timedelta(seconds=s))
limits = st.one_of(st.none(), st.integers(0, 120), st.floats(0, 120))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, st.text()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=8,
)


def header(as_celery_writes_it: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A header as Celery writes it, anything a message may carry, or no header."""
    return st.one_of(as_celery_writes_it, header_values, st.just(ABSENT))


message_headers = st.fixed_dictionaries(
    {
        "id": header(st.uuids().map(str)),
        "shadow": header(st.one_of(st.none(), st.text(max_size=300))),
        "retries": header(st.integers(0, 3)),
        "timelimit": header(st.lists(limits, min_size=2, max_size=2)),
        "eta": header(st.one_of(st.none(), near.map(datetime.isoformat))),
        "expires": header(st.one_of(st.none(), near.map(datetime.isoformat))),
        "parent_id": header(st.one_of(st.none(), st.uuids().map(str))),
        "root_id": header(st.uuids().map(str)),
        "x_deadline": header(near.map(encode)),
        "x_delivery_deadline": header(near.map(encode)),
        "x_deadline_origin": header(st.uuids().map(str)),
        "x_deadline_source": header(st.sampled_from(["call", "task", "expires"])),
    }
)
message_bodies = st.one_of(st.just(((), {}, None)), json_values)


class MainProcessUnderFuzz:
    """A DeadlineTask, Celery's strategy for it (tests/support/main_process.py), what its
    result backend was asked to store under, the refusals reported and the metrics."""

    def __init__(self) -> None:
        from celery import Celery
        from prometheus_client import CollectorRegistry

        from celery_deadlines import DeadlineTask, deadline_refused
        from celery_deadlines.contrib import prometheus as metrics
        from tests.support.main_process import MainProcess

        self.app = Celery("fuzz-main", broker="memory://", backend="cache+memory://")
        self.app.conf.deadlines_ledger = False
        self.task = self.app.task(
            base=DeadlineTask,
            name="fuzz.work",
            time_limit=60,
            soft_time_limit=50,
            shared=False,  # the fuzz app's alone: a shared task joins every app made after
        )(_work)
        self.main = MainProcess(self.app, self.task)
        self.stored: list[object] = []
        store_result = self.app.backend.store_result

        def stored(task_id: Any, *args: Any, **kwargs: Any) -> Any:
            self.stored.append(task_id)
            return store_result(task_id, *args, **kwargs)

        self.app.backend.store_result = stored  # type: ignore[method-assign]
        self.refused: list[Any] = []
        deadline_refused.connect(self._refused, weak=False)
        self.registry = CollectorRegistry()
        metrics.install(self.registry)

    def _refused(self, decision: Any, **_: Any) -> None:
        self.refused.append(decision)

    def refusal_labels(self) -> set[str]:
        """The ``task`` labels of the refusal counter."""
        return {
            sample.labels["task"]
            for family in self.registry.collect()
            if family.name == "celery_deadlines_refusals"
            for sample in family.samples
        }


def _work() -> None:
    """The body of the main-process property's task (never run: no pool runs it)."""


_UNDER_FUZZ: list[MainProcessUnderFuzz] = []


def under_fuzz() -> MainProcessUnderFuzz:
    if not _UNDER_FUZZ:
        _UNDER_FUZZ.append(MainProcessUnderFuzz())
    return _UNDER_FUZZ[0]


@fuzz
@given(message_headers, message_bodies)
@example({"id": 5, "x_deadline": FAKE_NOW.timestamp() - 1}, ((), {}, None))
@example({"timelimit": ["x", "y"], "x_deadline": FAKE_NOW.timestamp() + 30}, ((), {}, None))
@example({"retries": 10**30}, ((), {}, None))
@example({"expires": []}, ((), {}, None))  # Celery's own request: None.tzinfo (make fuzz)
def test_a_message_meets_only_documented_refusals_and_never_stops_the_main_process(
    fields: dict[str, Any], body: Any
) -> None:
    from celery.worker import state

    from celery_deadlines.testing import use_clock
    from tests.support.main_process import celery_headers

    fuzzed = under_fuzz()
    TALLY.examples += 1
    state.revoked.clear()  # an id Celery revoked in an earlier example is this one's too
    task_id = f"fuzz-{TALLY.examples}"  # one per example, as Celery makes them
    headers = celery_headers(fuzzed.app, fuzzed.task.name, task_id, **fields)
    headers = {key: value for key, value in headers.items() if value is not ABSENT}
    handed_before = len(fuzzed.main.pool.handed)
    fuzzed.refused.clear()
    fuzzed.stored.clear()
    with use_clock(FakeClock(FAKE_NOW)):
        delivery = fuzzed.main.deliver(headers, body)  # nothing raised into the consumer
    from celery_deadlines.rules import envelope  # the rule the outcome is judged by

    handed = fuzzed.main.pool.handed[handed_before:]
    # the message is ended once: acknowledged (refused, revoked, or accepted by the pool)
    # or rejected (Celery's own: an ETA it cannot convert)
    assert delivery.acks + len(delivery.rejects) == 1
    assert len(handed) + len(fuzzed.refused) <= 1
    for decision in fuzzed.refused:
        assert decision.reason in MAIN_PROCESS_REFUSALS, decision
        assert len(decision.detail) <= LONGEST_MESSAGE
    for job in handed:  # the pool is given durations, never what the message wrote
        assert envelope.is_duration(job.hard), job
        assert envelope.is_duration(job.soft), job
    for stored_id in fuzzed.stored:  # a result is stored only under a task id
        assert envelope.task_id({"id": stored_id}) == stored_id
    # the refusal counter's series: the registered task's name, and at most one fixed
    # label besides (never a name a message wrote)
    assert len(fuzzed.refusal_labels() - {fuzzed.task.name}) <= 1


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> Any:
    """The summary line, at the end of a run in one process (``make fuzz``)."""
    yield
    if TALLY.examples:
        leave(request.config, TALLY.summary())
