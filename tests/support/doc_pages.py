"""The site's pages as a system check's hint names them: ``Documentation: "<page
title>" > "<section>".`` (celery_deadlines.checks)."""

from __future__ import annotations

from tests.support.processes import REPO


def pages_by_title() -> dict[str, str]:
    """Every page of docs/ by its title (its first heading). A folder's index page (the
    how-tos') counts the titles of the pages beside it among its sections: the hint
    "How-tos" > "Keep the ledger bounded" names the how-tos and the page of that title."""
    docs = REPO / "docs"
    pages: dict[str, str] = {}
    for doc in docs.rglob("*.md"):
        if "_build" in doc.relative_to(docs).parts:
            continue
        text = doc.read_text()
        if doc.name == "index.md" and doc.parent != docs:
            beside = [page.read_text().splitlines()[0] for page in doc.parent.glob("*.md")]
            text += "\n" + "\n".join(f"#{title}" for title in beside)
        pages[text.splitlines()[0].removeprefix("# ")] = text
    return pages
