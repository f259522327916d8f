"""Screenshots of the admin for the README and docs/howto.md, from headless Chromium.

Run by hand (``make screenshots``; not part of the test suite or CI). Its dependencies
are optional and not among the package's extras:

    apt-get install chromium                 # Debian's package: /usr/bin/chromium
    .venv/bin/pip install playwright         # the Python client only; no browser download
    .venv/bin/python tools/screenshots.py

It runs the demo (``demo_project/run_demo.py``) into a scratch directory (SQLite + kombu's
filesystem transport), so the pictures show the demo's own runs. The demo reconciles the
lost reply of ``capture_payment``, so no effect is UNKNOWN when it ends; to show one, the
script adds a copy of that run as it stood before the reconciler found the charge (run
UNKNOWN, reason ``effect_unresolved``; its effect UNKNOWN after the read timed out). (Its
deadline is set minutes ahead, so the picture has time left whenever it is taken.) It
then creates an operator, serves the demo project with ``runserver`` on a free port, logs
the browser in with a session cookie and saves, 1366 px wide, into docs/images/:

* ``admin-run-list.png``: Celery deadlines → Runs;
* ``admin-run-unknown-effect.png``: the page of the run whose effect is UNKNOWN;
* ``admin-resolve-form.png``: the form its **Resolve…** button opens.

Django admin's navigation sidebar is open (its default) in every picture. The script
prints the widths it measured and fails when the page is wider than 1366 px or a table
(the run list, or the run page's timeline, side effects, plans) is wider than its box.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"
WIDTH, HEIGHT = 1366, 900
CHROMIUM = "/usr/bin/chromium"
INSTALL = (
    "This script needs Chromium and Playwright's Python client (no browser download):\n"
    "    apt-get install chromium\n"
    "    .venv/bin/pip install playwright\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def add_unknown_run() -> int:
    """A copy of the demo's ``capture_payment`` run as it stood before its reconciler
    found the charge: the run UNKNOWN, waiting for its effect, and the effect UNKNOWN.
    Written in the steps the ledger takes (enqueued, claimed, the effect dispatched and
    its reply lost, the attempt ended), so the page's timeline has them. Returns the
    copy's primary key."""
    import django

    django.setup()
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
    now = start
    copy = Run.objects.get(pk=original.pk)
    copy.pk = None
    copy.task_id = f"{original.task_id[:-8]}0000beef"
    copy.status, copy.reason, copy.detail = Status.QUEUED, "", ""
    copy.owner, copy.lease_token, copy.lease_expires_at = "", 0, None
    copy.attempt, copy.version, copy.op, copy.op_detail = 0, 1, "enqueue", ""
    copy.created_at = copy.updated_at = now
    # Minutes to spare, so the picture has time left whenever it is taken.
    copy.deadline = now + timedelta(minutes=5)
    copy.delivery_deadline = now + timedelta(minutes=6)
    copy.save()
    run = Run.objects.filter(pk=copy.pk)
    owner = "celery@shop:4242"
    run.update(
        status=Status.RUNNING, owner=owner, lease_token=1, attempt=1, version=2, op="claim",
        lease_expires_at=start + timedelta(seconds=30), updated_at=start + timedelta(seconds=0.2),
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
        effect.created_at = effect.dispatched_at = effect.updated_at = start + timedelta(
            seconds=0.3
        )
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
    return int(copy.pk)


def prepare(var: Path) -> int:
    """Run the demo into ``var``, add the UNKNOWN run and an operator."""
    subprocess.run([sys.executable, "-m", "demo_project.run_demo"], cwd=REPO, check=True)
    pk = add_unknown_run()
    from django.contrib.auth.models import User

    User.objects.create_superuser("operator", "ops@example.com", "demo-password")
    return pk


def session_cookie(port: int) -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.db import SessionStore

    user = User.objects.get(username="operator")
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return {
        "name": settings.SESSION_COOKIE_NAME,
        "value": session.session_key,
        "url": f"http://127.0.0.1:{port}",
    }


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


def shoot(port: int, unknown_pk: int) -> dict[str, dict[str, int]]:
    """Save the three pictures; return the widths measured (page, and the widest table
    against its box, which scrolls sideways or overflows when the table is wider)."""
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{port}/admin/celery_deadlines"
    cookie = session_cookie(port)  # before Playwright: Django refuses its event loop
    widths: dict[str, dict[str, int]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
            context.add_cookies([cookie])  # type: ignore[list-item]
            page = context.new_page()

            page.goto(f"{base}/run/")
            assert "order-43" in page.content(), "the demo's runs are not listed"
            # Django admin's default: the navigation sidebar open.
            widths["run list"] = page.evaluate(WIDTHS)
            page.screenshot(path=str(IMAGES / "admin-run-list.png"))

            page.goto(f"{base}/run/{unknown_pk}/change/")
            assert page.locator("button.cdl-resolve").count() == 1, "no Resolve… button"
            widths["run page"] = page.evaluate(WIDTHS)
            wide = max(WIDTH, widths["run page"]["page"])
            bottom = page.evaluate(
                "() => { const h = [...document.querySelectorAll('h2, summary, legend')]"
                ".find(e => /Message|message/.test(e.textContent));"
                " return h ? h.getBoundingClientRect().top + window.scrollY : 1100; }"
            )
            page.screenshot(
                path=str(IMAGES / "admin-run-unknown-effect.png"),
                full_page=True,
                clip={"x": 0, "y": 0, "width": wide, "height": int(bottom) - 10},
            )

            with page.expect_navigation():
                page.locator("button.cdl-resolve").click()
            assert "Evidence" in page.content(), "the resolve form did not open"
            page.screenshot(
                path=str(IMAGES / "admin-resolve-form.png"),
                clip={"x": 0, "y": 0, "width": WIDTH, "height": 560},
            )
        finally:
            browser.close()
    return widths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the demo's scratch directory")
    args = parser.parse_args()
    try:
        import playwright  # noqa: F401
    except ImportError:
        raise SystemExit(INSTALL) from None
    if not Path(CHROMIUM).exists():
        raise SystemExit(INSTALL)

    var = Path(tempfile.mkdtemp(prefix="cd-screenshots-"))
    os.environ["DEMO_VAR_DIR"] = str(var)
    os.environ["DJANGO_SETTINGS_MODULE"] = "demo_project.settings"
    sys.path.insert(0, str(REPO))
    port = free_port()
    server = None
    try:
        unknown_pk = prepare(var)
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/")
                break
            except OSError:
                time.sleep(0.1)
        widths = shoot(port, unknown_pk)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if args.keep:
            print(f"the demo's data: {var}")
        else:
            shutil.rmtree(var, ignore_errors=True)
    for name in ("admin-run-list", "admin-run-unknown-effect", "admin-resolve-form"):
        path = IMAGES / f"{name}.png"
        print(f"saved {path.relative_to(REPO)} ({path.stat().st_size // 1024} KB)")
    for where, w in widths.items():
        fits = "fits" if w["page"] <= WIDTH else "a horizontal scrollbar on the page"
        line = f"{where} at a {WIDTH} px window: page {w['page']} px ({fits})"
        if w["box"]:
            scrolls = "fits" if w["table"] <= w["box"] else "scrolls sideways"
            line += f"; table {w['table']} px in a {w['box']} px box ({scrolls})"
        print(line)
    wide = [where for where, w in widths.items() if w["page"] > WIDTH or w["table"] > w["box"]]
    if wide:
        raise SystemExit(f"does not fit {WIDTH} px with the sidebar open: {', '.join(wide)}")


if __name__ == "__main__":
    main()
