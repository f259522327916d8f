"""The operator's path through the console at 3 a.m., in a real browser: one flow that
``tests/browser/test_console_in_chromium.py`` drives and ``tools/screenshots.py``
photographs (``make browser``, ``make screenshots``).

:func:`prepare` runs the demo (``demo_project/run_demo.py``) into a scratch directory
(SQLite, kombu's filesystem transport) and adds the run an operator is paged for: a
copy of the demo's ``capture_payment`` run as it stood before its reconciler found the
charge (UNKNOWN, its effect UNKNOWN after the read timed out), whose deadline passed
while it waited. :func:`serving` serves the demo project with ``runserver`` on a free
port. :func:`walk` is the path, headless Chromium at 1366 px with Django admin's
navigation sidebar open (its default):

1. log in; the run list fits the window, no word in it wraps inside itself;
2. find the run by the short id the list shows, and open it;
3. the run's page: UNKNOWN, the effect with **Resolve…**;
4. the resolve form warns that the deadline has passed, and what resolving does;
5. a result that is not JSON: the form comes back with the error beside the field and
   the evidence kept; corrected, the charge is resolved as found;
6. the effect list says what happened to the run, and fits the window;
7. the run's page again: EXPIRED ``performed_past_deadline``, and the caller's result
   (django-celery-results' row) the ``PerformedPastDeadline`` the caller was told.

Nothing here downloads a browser: Debian's ``chromium`` (``apt-get install -y
chromium``) and Playwright's Python client (``pip install playwright``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 1366, 900
CHROMIUM = "/usr/bin/chromium"
#: Chromium alone, headless, reaching nothing but the page under test.
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL = (
    "The console's browser flow needs Debian's Chromium and Playwright's Python client "
    "(no browser download):\n"
    "    apt-get install -y chromium\n"
    "    .venv/bin/pip install playwright\n"
)
USER, PASSWORD = "night-shift", "demo-password"
EVIDENCE = "provider dashboard: charge ch_42 captured at 03:12; ticket OPS-7"


@dataclass(frozen=True)
class Paged:
    """The run the operator is paged for."""

    pk: int
    task_id: str


def missing() -> str | None:
    """What is missing to drive the browser (``None``: nothing)."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return INSTALL
    return None if Path(CHROMIUM).exists() else INSTALL


def demo_environment(var: Path) -> dict[str, str]:
    """The environment of the demo's processes: everything in ``var`` (SQLite, the
    filesystem broker: nothing shared with another session), its queues as the demo
    names them."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if name not in ("CELERY_BROKER_URL", "DATABASE_URL", "DEMO_QUEUE_PREFIX")
    }
    return {
        **inherited,
        "DEMO_VAR_DIR": str(var),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        "PYTHONPATH": str(REPO),
    }


def prepare(var: Path) -> Paged:
    """Run the demo into ``var``, then add the paged run and the operator (in a process
    of the demo's own: this one's Django stays as it is)."""
    env = demo_environment(var)
    subprocess.run(
        [sys.executable, "-m", "demo_project.run_demo"],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    made = subprocess.run(
        [sys.executable, "-m", "tests.support.console_flow"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return Paged(**json.loads(made.stdout.strip().splitlines()[-1]))


def add_paged_run() -> Paged:
    """A copy of the demo's ``capture_payment`` run as it stood before its reconciler
    found the charge, written in the steps the ledger takes (enqueued, claimed, the
    effect dispatched and its reply lost, the attempt ended UNKNOWN), so its timeline
    has them; its deadline passed seconds after the attempt ended. And the operator."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.utils import timezone

    from celery_deadlines.models import Effect, Run
    from celery_deadlines.rules.states import EffectState, Status

    original = Run.objects.filter(task_name__endswith="capture_payment").order_by("id").first()
    if original is None:
        raise SystemExit("the demo left no capture_payment run")
    effects = list(original.effects.order_by("id"))
    if not effects:
        raise SystemExit("the demo's capture_payment run has no effect")
    start = timezone.now() - timedelta(seconds=4)
    copy = Run.objects.get(pk=original.pk)
    copy.pk = None
    copy.task_id = str(uuid.uuid4())  # its own short id: the operator finds it by that
    copy.status, copy.reason, copy.detail = Status.QUEUED, "", ""
    copy.owner, copy.lease_token, copy.lease_expires_at = "", 0, None
    copy.attempt, copy.version, copy.op, copy.op_detail = 0, 1, "enqueue", ""
    copy.created_at = copy.updated_at = copy.published_at = start
    # the attempt had 3.5 s; its charge's reply was lost after 3 s; the operator comes
    # after the deadline
    copy.deadline = start + timedelta(seconds=3.5)
    copy.delivery_deadline = start + timedelta(minutes=1)
    copy.save()
    run = Run.objects.filter(pk=copy.pk)
    owner = "celery@shop:4242"
    run.update(
        status=Status.RUNNING, owner=owner, lease_token=1, attempt=1, version=2, op="claim",
        lease_expires_at=start + timedelta(seconds=3.5), updated_at=start + timedelta(seconds=0.2),
    )  # fmt: skip
    keys = []
    for effect in effects:
        effect.pk = None
        effect.run = copy
        effect.key = f"{effect.key}:before-reconciliation"
        effect.state = EffectState.DISPATCHED
        effect.lease_token, effect.dispatches = 1, 1
        effect.result = effect.evidence = None
        effect.error = ""
        effect.settled_by = None
        at = start + timedelta(seconds=0.3)
        effect.created_at = effect.dispatched_at = effect.updated_at = at
        effect.save()
        Effect.objects.filter(pk=effect.pk).update(
            state=EffectState.UNKNOWN,
            error="TimeoutError('read timed out')",
            updated_at=start + timedelta(seconds=3.3),
        )
        keys.append(effect.key)
    detail = f"outcome unknown for effect(s) {', '.join(keys)} after TimeoutError('read timed out')"
    run.update(
        status=Status.UNKNOWN, reason="effect_unresolved", detail=detail, version=3,
        lease_expires_at=None, op="unknown", op_detail=detail,
        updated_at=start + timedelta(seconds=3.31),
    )  # fmt: skip
    User.objects.create_superuser(USER, "ops@example.com", PASSWORD)
    return Paged(pk=int(copy.pk), task_id=copy.task_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serving(var: Path) -> Iterator[str]:
    """The demo project served by ``runserver`` on a free port: its base URL."""
    port = free_port()
    log = (var / "runserver.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=REPO, env=demo_environment(var), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{base}/admin/login/", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"runserver exited; see {var / 'runserver.log'}") from None
                time.sleep(0.1)  # polling a server that is starting, not a wait for an outcome
        yield base
    finally:
        server.terminate()
        server.wait(10)
        log.close()


#: The page's width and the widest table's against its box (a table wider than its box
#: scrolls sideways or overflows).
WIDTHS = """() => {
    const results = document.querySelector("#changelist .results");
    let table = results ? results.scrollWidth : 0, box = results ? results.clientWidth : 0;
    for (const t of document.querySelectorAll(".cdl-table")) {  // the run page's tables
        if (!box || t.scrollWidth - t.parentElement.clientWidth > table - box) {
            table = t.scrollWidth;
            box = t.parentElement.clientWidth;
        }
    }
    return {page: document.documentElement.scrollWidth, table: table, box: box};
}"""

#: The words of the list's cells that the browser broke inside themselves: each text
#: node without a space (an id, a reason, a name: the part between two <wbr>) must lie
#: on one line.
BROKEN_WORDS = """() => {
    const broken = [];
    for (const cell of document.querySelectorAll("#result_list td, #result_list th")) {
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const text = node.textContent.trim();
            if (!text || /\\s/.test(text)) continue;
            const range = document.createRange();
            range.selectNodeContents(node);
            const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
            if (lines.size > 1) broken.push(text);
        }
    }
    return broken;
}"""


@dataclass
class Walked:
    """What the walk saw: the widths and broken words of each page it measured, the
    short id it searched, the form's warning, and what the pages said at the end."""

    widths: dict[str, dict[str, int]]
    broken: dict[str, list[str]]
    short_id: str = ""
    found_rows: int = 0
    warning: str = ""
    form_error: str = ""
    evidence_kept: str = ""
    message: str = ""
    status: str = ""
    caller: str = ""


#: Saves a picture of the page: (page, name, full page's height clip or None).
Shoot = Callable[[Any, str, int | None], None]


def walk(page: Any, base: str, paged: Paged, shoot: Shoot | None = None) -> Walked:
    """The operator's path (the module's docstring), on Playwright's ``page``."""
    picture: Shoot = shoot or (lambda *_: None)
    walked = Walked(widths={}, broken={})

    def measure(name: str) -> None:
        walked.widths[name] = page.evaluate(WIDTHS)
        walked.broken[name] = page.evaluate(BROKEN_WORDS)

    page.goto(f"{base}/admin/login/?next=/admin/celery_deadlines/run/")
    page.fill("#id_username", USER)
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation():
        page.click("input[type=submit]")
    assert "order-43" in page.content(), "the demo's runs are not listed"
    measure("run list")
    picture(page, "admin-run-list", None)

    # find it by the short id the list shows, as an operator copies it
    walked.short_id = page.locator(f'span[title="{paged.task_id}"]').first.inner_text()
    page.fill("#searchbar", walked.short_id)
    with page.expect_navigation():
        page.press("#searchbar", "Enter")
    walked.found_rows = page.locator("#result_list tbody tr").count()
    with page.expect_navigation():
        page.locator(f'#result_list a:has(span[title="{paged.task_id}"])').click()

    assert page.locator("button.cdl-resolve").count() == 1, "no Resolve… button"
    measure("run page")
    picture(page, "admin-run-unknown-effect", above_the_message(page))

    with page.expect_navigation():
        page.locator("button.cdl-resolve").click()
    warning = page.locator("#cdl-past-deadline")
    walked.warning = warning.inner_text() if warning.count() else ""
    picture(page, "admin-resolve-form", None)

    page.check('input[name="found"][value="yes"]')
    page.fill('textarea[name="evidence"]', EVIDENCE)
    page.fill('textarea[name="result"]', '{"charge": ch_42}')
    with page.expect_navigation():
        page.click('input[name="apply"]')
    errors = page.locator(".errorlist")
    walked.form_error = errors.first.inner_text() if errors.count() else ""
    walked.evidence_kept = page.input_value('textarea[name="evidence"]')
    page.fill('textarea[name="result"]', '{"charge": "ch_42"}')
    with page.expect_navigation():
        page.click('input[name="apply"]')
    walked.message = page.locator(".messagelist").inner_text()
    measure("effect list")

    page.goto(f"{base}/admin/celery_deadlines/run/{paged.pk}/change/")
    walked.status = page.locator("#cdl-status").inner_text()
    walked.caller = page.locator(".field-result_or_error .readonly").inner_text()
    picture(page, "admin-run-performed-past-deadline", above_the_message(page))
    return walked


def above_the_message(page: Any) -> int:
    """How far down the run's page its message section starts: a picture of the page
    ends there (the summary, timeline, effects, workflow, times and result above it)."""
    top = page.evaluate(
        "() => { const h = [...document.querySelectorAll('h2, summary, legend')]"
        ".find(e => /Message/.test(e.textContent));"
        " return h ? h.getBoundingClientRect().top + window.scrollY : 1100; }"
    )
    return int(top) - 10


if __name__ == "__main__":  # the demo's process: add the paged run, say which it is
    made = add_paged_run()
    print(json.dumps({"pk": made.pk, "task_id": made.task_id}))
