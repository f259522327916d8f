"""The ledger's statements, as each dialect receives them, against the golden files in
``tests/golden/sql/<statement>.<dialect>.sql``: a change of any statement's SQL shows in
the diff of its golden file. No database is needed: each text is rendered once, at
import, from its template (``celery_deadlines.ledger.sql.statements.Sql``).

After a deliberate change of a statement, rewrite the golden files and review their diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest -n0 tests/django/ledger/sql/test_statements_golden.py

(the golden files of statements that no longer exist are deleted too).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from celery_deadlines.ledger.sql import connection  # noqa: F401 (imports every group)
from celery_deadlines.ledger.sql.dialect import POSTGRESQL
from celery_deadlines.ledger.sql.statements import STATEMENTS, one_line, render

GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "sql"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
#: psycopg caches the parsing of a statement of up to this many bytes (and parses a
#: longer one again at every call).
PSYCOPG_CACHED_LENGTH = 4096

RENDERED = {
    f"{name}.{vendor}.sql": layout + "\n"
    for name, statement in sorted(STATEMENTS.items())
    for vendor, layout in sorted(statement.layout.items())
}


@pytest.mark.parametrize("filename", sorted(RENDERED))
def test_each_statement_is_what_its_golden_file_says(filename: str) -> None:
    path = GOLDEN / filename
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(RENDERED[filename])
    assert path.exists(), f"no golden file {path} (UPDATE_GOLDEN=1 writes it)"
    assert RENDERED[filename] == path.read_text(), (
        f"{filename} changed (UPDATE_GOLDEN=1 rewrites it; review the diff)"
    )


def test_every_golden_file_is_a_statement_of_the_ledger() -> None:
    stale = sorted(path.name for path in GOLDEN.glob("*.sql") if path.name not in RENDERED)
    if UPDATE:
        for name in stale:
            (GOLDEN / name).unlink()
        stale = []
    assert stale == []


def test_the_claim_and_the_worker_statements_are_covered_on_both_databases() -> None:
    covered = {
        "runs.claim": {"postgresql", "sqlite"},
        "runs.claim_refusal": {"sqlite"},
        "runs.renew": {"postgresql", "sqlite"},
        "runs.finish": {"postgresql", "sqlite"},
        "effects.dispatch": {"postgresql", "sqlite"},
        "effects.dispatch_fresh": {"postgresql", "sqlite"},
        "effects.settle": {"postgresql", "sqlite"},
        "supervision.end_owned": {"postgresql", "sqlite"},
        "sweeps.unclaimed": {"postgresql", "sqlite"},
        "sweeps.mark_republished": {"postgresql", "sqlite"},
        "sweeps.requeue_lapsed": {"postgresql", "sqlite"},
        "sweeps.settle_lapsed": {"postgresql", "sqlite"},
        "sweeps.fail_unreadable": {"postgresql", "sqlite"},
    }
    assert {name: set(STATEMENTS[name].layout) for name in covered} == covered


def test_a_statement_is_sent_as_its_golden_layout_on_one_line() -> None:
    claim = STATEMENTS["runs.claim"]
    sent = claim.text["postgresql"]
    assert "\n" not in sent
    assert sent == one_line(claim.layout["postgresql"])
    assert sent.startswith("WITH claimed AS ( UPDATE celery_deadlines_run SET status = 'RUNNING'")


def test_one_line_joins_lines_and_leaves_white_space_inside_a_line_alone() -> None:
    assert one_line("SELECT 'a  b'\n    FROM t\n\n  WHERE x") == "SELECT 'a  b' FROM t WHERE x"


def test_the_postgresql_claim_is_short_enough_for_psycopg_to_cache_its_parsing() -> None:
    assert len(STATEMENTS["runs.claim"].text["postgresql"].encode()) <= PSYCOPG_CACHED_LENGTH


def test_no_statement_holds_an_unfilled_slot() -> None:
    unfilled = [
        (name, vendor)
        for name, statement in STATEMENTS.items()
        for vendor, text in statement.text.items()
        if "{" in text or "}" in text
    ]
    assert unfilled == []


def test_a_kept_run_without_its_alias_is_refused_when_the_statement_is_rendered() -> None:
    with pytest.raises(ValueError, match="run_kept:alias"):
        render("SELECT 1 FROM {run} WHERE id = %s {run_kept}", POSTGRESQL)
    assert render("SELECT 1 FROM {run} r WHERE id = %s {run_kept:r}", POSTGRESQL).endswith(
        "kept.id = r.id FOR KEY SHARE)"
    )
