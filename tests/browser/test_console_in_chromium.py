"""The operator's console in a real browser: headless Chromium (Debian's) through
Playwright's Python client, against the demo project served by ``runserver``
(``tests/support/console_flow.py``: the same path ``make screenshots`` photographs).

Opt-in (``make browser``, about two minutes: the demo runs first, beyond what CI's
budget holds): skipped unless ``DEADLINES_BROWSER=1``, which the target sets after it
installs Playwright's client into the venv and finds ``/usr/bin/chromium``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support import console_flow
from tests.support.console_flow import HEIGHT, WIDTH

pytestmark = pytest.mark.skipif(
    os.environ.get("DEADLINES_BROWSER") != "1",
    reason="opt-in: make browser (Debian's chromium and Playwright's Python client)",
)


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[console_flow.Walked]:
    """The path walked once (the demo runs first); each test reads what it saw."""
    lacking = console_flow.missing()
    if lacking:
        pytest.fail(lacking, pytrace=False)
    from playwright.sync_api import sync_playwright

    var = tmp_path_factory.mktemp("console-flow")
    paged = console_flow.prepare(var)
    with console_flow.serving(var) as base, sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=console_flow.CHROMIUM, args=console_flow.LAUNCH_ARGS
        )
        try:
            context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
            yield console_flow.walk(context.new_page(), base, paged)
        finally:
            browser.close()


def test_an_operator_finds_a_run_by_its_short_id_resolves_its_charge_and_sees_the_callers_result(
    walked: console_flow.Walked,
) -> None:
    # found by the short id the list shows, copied with its ellipsis
    assert walked.short_id.endswith("…")
    assert walked.found_rows == 1
    # warned before submitting: the deadline passed, and what resolving does
    assert "The deadline has passed" in walked.warning
    assert "performed_past_deadline" in walked.warning
    # a result that is not JSON: said beside the field, the evidence kept
    assert "must be JSON" in walked.form_error
    assert walked.evidence_kept == console_flow.EVIDENCE
    assert "expired (performed_past_deadline: the effect is recorded as performed" in (
        walked.message
    )
    # the run's page, and the caller's result stored by django-celery-results
    assert "EXPIRED" in walked.status
    assert "performed_past_deadline" in walked.status.replace("\u200b", "")
    assert "FAILURE" in walked.caller
    assert "PerformedPastDeadline" in walked.caller


def test_the_run_and_effect_lists_fit_1366_px_with_the_sidebar_open_and_break_no_word(
    walked: console_flow.Walked,
) -> None:
    for page in ("run list", "effect list"):
        width = walked.widths[page]
        assert width["page"] <= WIDTH, f"the {page} is {width['page']} px wide"
        assert width["table"] <= width["box"], f"the {page}'s table scrolls: {width}"
        assert walked.broken[page] == [], f"the {page} breaks words: {walked.broken[page]}"
