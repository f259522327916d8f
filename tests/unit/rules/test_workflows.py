"""The workflow rule as a pure function: a chain adds, a group takes its longest member,
a chord its header then its body; what is left decides, and the detail shows the sums."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from celery_deadlines import Reason, WorkflowRefused
from celery_deadlines.rules.workflows import Chain, Chord, Group, Node, Step, fit, need, undeclared

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def step(name: str, timeout: float | None = None, reserve: float = 0, countdown: float = 0) -> Step:
    return Step(
        name, None if timeout is None else seconds(timeout), seconds(reserve), seconds(countdown)
    )


def test_a_chain_needs_the_sum_of_its_steps_attempt_timeouts() -> None:
    assert need(Chain((step("a", 10), step("b", 20), step("c", 5)))).total == seconds(35)


def test_a_group_needs_its_longest_member() -> None:
    assert need(Group((step("a", 10), step("b", 20), step("c", 5)))).total == seconds(20)


def test_a_chord_needs_its_longest_header_member_then_its_body() -> None:
    chord = Chord(Group((step("a", 10), step("b", 20))), step("sum", 7))
    assert need(chord).total == seconds(27)


def test_nesting_composes_chains_groups_and_chords() -> None:
    inner = Chain((step("a", 10), Group((step("b", 3), Chain((step("c", 4), step("d", 4)))))))
    tree = Chain((inner, Chord(Group((step("e", 1), inner)), step("f", 2))))
    # inner: 10 + max(3, 8) = 18; the chord: max(1, 18) + 2 = 20
    assert need(tree).total == seconds(38)


def test_countdowns_delay_their_step() -> None:
    assert need(Chain((step("a", 10, countdown=5), step("b", 20)))).total == seconds(35)


def test_a_reserve_larger_than_what_follows_the_start_is_what_a_step_needs() -> None:
    # b must find 30 s left when it starts, though it runs for 5
    assert need(Chain((step("a", 10), step("b", 5, reserve=30)))).total == seconds(40)
    # a reserve smaller than the rest of the path adds nothing
    assert need(Chain((step("a", 10, reserve=3), step("b", 5)))).total == seconds(15)


def test_empty_groups_and_chains_need_nothing() -> None:
    assert need(Group(())).total == timedelta(0)
    assert need(Chain((step("a", 1), Group(())))).total == seconds(1)


def test_a_workflow_that_fits_exactly_is_allowed() -> None:
    decision = fit(Chain((step("a", 10), step("b", 20))), NOW + seconds(30), NOW)
    assert decision.allowed
    assert decision.remaining == seconds(30)


def test_a_workflow_one_microsecond_too_long_is_refused_with_the_arithmetic() -> None:
    tree = Chain((step("a", 10, countdown=5), Group((step("b", 20), step("c", 8)))))
    decision = fit(tree, NOW + seconds(34.999999), NOW)
    assert decision.reason is Reason.WORKFLOW_CANNOT_FIT
    assert decision.gate == "enqueue"
    assert decision.detail == (
        "the workflow needs 35.000 s (a: countdown 5.000 s + a: attempt timeout 10.000 s + "
        "b: attempt timeout 20.000 s) but 35.000 s left"
    )


def test_steps_without_an_attempt_timeout_count_as_zero_and_are_named() -> None:
    tree = Chain((step("a", 10), step("plain"), step("b"), step("plain")))
    decision = fit(tree, NOW + seconds(5), NOW)
    assert decision.reason is Reason.WORKFLOW_CANNOT_FIT
    assert decision.detail.endswith(
        "but 5.000 s left; no attempt timeout declared, counted as zero: plain, b"
    )
    assert undeclared(tree) == ["plain", "b"]


def test_a_passed_deadline_is_said_as_such() -> None:
    decision = fit(step("a"), NOW - seconds(2), NOW)
    assert decision.reason is Reason.WORKFLOW_CANNOT_FIT
    assert "no step declares a duration) but the deadline passed 2.000 s ago" in decision.detail


def test_the_refusal_is_a_workflow_refused_under_deadline_refused() -> None:
    decision = fit(step("a", 60), NOW + seconds(30), NOW)
    refusal = decision.refusal()
    assert isinstance(refusal, WorkflowRefused)
    assert refusal.reason == "workflow_cannot_fit"
    assert refusal.gate == "enqueue"
    assert "a: attempt timeout 60.000 s" in str(refusal)
    # it crosses a result backend like its parent: rebuilt from its JSON args
    assert str(WorkflowRefused(*refusal.args)) == str(refusal)


# -- properties ------------------------------------------------------------------------------

durations = st.integers(min_value=0, max_value=10_000).map(lambda ms: timedelta(milliseconds=ms))
steps_ = st.builds(
    Step,
    name=st.sampled_from(["a", "b", "c"]),
    attempt_timeout=st.one_of(st.none(), durations),
    reserve=durations,
    countdown=durations,
)
trees: st.SearchStrategy[Node] = st.recursive(
    steps_,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda nodes: Chain(tuple(nodes))),
        st.lists(inner, max_size=4).map(lambda nodes: Group(tuple(nodes))),
        st.builds(
            lambda header, body: Chord(Group(tuple(header)), body),
            st.lists(inner, max_size=3),
            inner,
        ),
    ),
    max_leaves=12,
)


@given(tree=trees, extra=steps_, position=st.integers(min_value=0, max_value=8), budget=durations)
def test_adding_a_step_to_a_chain_never_makes_a_workflow_fit_that_did_not(
    tree: Node, extra: Step, position: int, budget: timedelta
) -> None:
    nodes = list(tree.nodes) if isinstance(tree, Chain) else [tree]
    longer = Chain((*nodes[:position], extra, *nodes[position:]))
    if not fit(tree, NOW + budget, NOW).allowed:
        assert not fit(longer, NOW + budget, NOW).allowed


@given(tree=trees, extra=steps_, budget=durations)
def test_adding_a_member_to_a_group_never_makes_a_workflow_fit_that_did_not(
    tree: Node, extra: Step, budget: timedelta
) -> None:
    members = list(tree.nodes) if isinstance(tree, Group) else [tree]
    wider = Group((*members, extra))
    if not fit(tree, NOW + budget, NOW).allowed:
        assert not fit(wider, NOW + budget, NOW).allowed


@given(tree=trees)
def test_the_detail_adds_up_to_what_the_workflow_needs(tree: Node) -> None:
    needed = need(tree)
    total = sum(
        (seconds(float(term.rsplit(" ", 2)[-2])) for term in needed.terms), start=timedelta(0)
    )
    assert abs(total - needed.total) <= timedelta(milliseconds=1) * max(len(needed.terms), 1)


@given(tree=trees, budget=durations)
def test_a_workflow_fits_exactly_when_its_need_is_at_most_what_is_left(
    tree: Node, budget: timedelta
) -> None:
    assert fit(tree, NOW + budget, NOW).allowed == (need(tree).total <= budget)
