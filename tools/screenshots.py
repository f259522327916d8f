"""Screenshots of the admin for docs/demo.md and docs/howto/admin.md, from headless Chromium.

``make screenshots`` (it installs Playwright's Python client into the venv; not part of
the test suite or CI). It needs Debian's Chromium, and downloads no browser:

    apt-get install -y chromium              # /usr/bin/chromium
    make screenshots

The pictures are taken along the operator's path that ``make browser`` tests
(``tests/support/console_flow.py``): the demo's runs in a scratch directory (SQLite +
kombu's filesystem transport), and the run an operator is paged for (a copy of the
demo's ``capture_payment`` before its reconciler found the charge, UNKNOWN, its deadline
passed while it waited). Saved 1366 px wide, Django admin's navigation sidebar open
(its default), into docs/images/:

* ``admin-run-list.png``: Celery deadlines → Runs;
* ``admin-run-unknown-effect.png``: the page of the run whose effect is UNKNOWN, found
  by the short id the list shows;
* ``admin-resolve-form.png``: the form its **Resolve…** button opens, warning that the
  deadline has passed and what resolving does;
* ``admin-run-performed-past-deadline.png``: the run after the charge was resolved as
  found: EXPIRED ``performed_past_deadline``, and what its caller was told.

The script prints the widths it measured and fails when a list or a page is wider
than 1366 px, or breaks a word inside itself.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"
sys.path.insert(0, str(REPO))

from tests.support import console_flow  # noqa: E402
from tests.support.console_flow import HEIGHT, WIDTH  # noqa: E402

#: The height of each picture that is not cut where the run page's message begins.
CLIPS = {"admin-resolve-form": 640}


def shoot(page: Any, name: str, bottom: int | None) -> None:
    """Save ``name``: the window (or up to ``bottom`` of the whole page)."""
    path = str(IMAGES / f"{name}.png")
    if bottom is not None:
        wide = max(WIDTH, page.evaluate("() => document.documentElement.scrollWidth"))
        clip = {"x": 0, "y": 0, "width": wide, "height": bottom}
        page.screenshot(path=path, full_page=True, clip=clip)
    else:
        height = CLIPS.get(name, HEIGHT)
        page.screenshot(path=path, clip={"x": 0, "y": 0, "width": WIDTH, "height": height})
    print(f"saved docs/images/{name}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the demo's scratch directory")
    args = parser.parse_args()
    lacking = console_flow.missing()
    if lacking:
        raise SystemExit(lacking)
    from playwright.sync_api import sync_playwright

    var = Path(tempfile.mkdtemp(prefix="cd-screenshots-"))
    try:
        paged = console_flow.prepare(var)
        with console_flow.serving(var) as base, sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=console_flow.CHROMIUM, args=console_flow.LAUNCH_ARGS
            )
            try:
                context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
                walked = console_flow.walk(context.new_page(), base, paged, shoot)
            finally:
                browser.close()
    finally:
        if args.keep:
            print(f"the demo's data: {var}")
        else:
            shutil.rmtree(var, ignore_errors=True)
    problems = []
    for where, w in walked.widths.items():
        fits = "fits" if w["page"] <= WIDTH else "a horizontal scrollbar on the page"
        line = f"{where} at a {WIDTH} px window: page {w['page']} px ({fits})"
        if w["box"]:
            scrolls = "fits" if w["table"] <= w["box"] else "scrolls sideways"
            line += f"; table {w['table']} px in a {w['box']} px box ({scrolls})"
        print(line)
        if w["page"] > WIDTH or (where != "run page" and w["table"] > w["box"]):
            problems.append(where)
    for where, words in walked.broken.items():
        if words:
            problems.append(f"{where} breaks {', '.join(words)} inside a word")
    if problems:
        raise SystemExit(f"does not fit {WIDTH} px with the sidebar open: {'; '.join(problems)}")


if __name__ == "__main__":
    main()
