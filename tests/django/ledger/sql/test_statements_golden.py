"""The ledger's statements, as each dialect receives them, against the golden files in
``tests/golden/sql/<statement>.<dialect>.sql``: a change of any statement's SQL shows in
the diff of its golden file. No database is needed: each text is rendered once, at
import, from its text in ``celery_deadlines/ledger/sql/<group>.sql``
(``celery_deadlines.ledger.sql.statements``).

After a deliberate change of a statement, rewrite the golden files and review their diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest -n0 tests/django/ledger/sql/test_statements_golden.py

(the golden files of statements that no longer exist are deleted too).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from celery_deadlines.ledger.sql import (
    connection,  # noqa: F401 (imports every group)
    statements,
)
from celery_deadlines.ledger.sql.dialect import POSTGRESQL
from celery_deadlines.ledger.sql.statements import STATEMENTS, one_line, render
from celery_deadlines.rules.records import ClaimRefused

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
        render("SELECT 1 FROM celery_deadlines_run WHERE id = %s {run_kept}", POSTGRESQL)
    assert render(
        "SELECT 1 FROM celery_deadlines_run r WHERE id = %s {run_kept:r}", POSTGRESQL
    ).endswith("kept.id = r.id FOR KEY SHARE)")


# The claim is written whole for each database: its condition is the UPDATE's WHERE, a
# check a line, and a lost claim's reason the first check that fails (a CASE of the same
# checks). These read the statements as written and hold the copies to one another.


def claim_condition(template: str) -> list[str]:
    """The checks of the claim's WHERE, in order (after the run's id)."""
    lines = [line.strip() for line in template.splitlines()]
    start = lines.index("WHERE task_id = %(task_id)s") + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("AND "))
    return [line.removeprefix("AND ") for line in lines[start:end]]


def refusal_reasons(template: str) -> tuple[list[tuple[str, str]], str]:
    """A lost claim's CASE: ``(check, why)`` in order, and the ELSE's reason."""
    whens = re.findall(r"^\s*WHEN NOT \((.*)\) THEN '(\w+)'$", template, re.MULTILINE)
    (otherwise,) = re.findall(r"^\s*ELSE '(\w+)'$", template, re.MULTILINE)
    return whens, otherwise


CLAIM = STATEMENTS["runs.claim"].template
REFUSAL = {
    "postgresql": CLAIM["postgresql"],
    "sqlite": STATEMENTS["runs.claim_refusal"].template["sqlite"],
}


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite"])
def test_a_lost_claims_reason_is_the_first_check_of_the_claims_condition_that_fails(
    vendor: str,
) -> None:
    checks = claim_condition(CLAIM[vendor])
    whens, otherwise = refusal_reasons(REFUSAL[vendor])

    assert len(checks) == 11
    assert [check for check, _ in whens] == checks[:-1]
    assert whens[0][1] == ClaimRefused.TASK_MISMATCH
    assert otherwise == ClaimRefused.CHANGED  # the last check's, and a claim's that raced


def test_the_claim_and_its_refusal_are_written_alike_for_both_databases() -> None:
    assert claim_condition(CLAIM["postgresql"]) == claim_condition(CLAIM["sqlite"])
    assert refusal_reasons(REFUSAL["postgresql"]) == refusal_reasons(REFUSAL["sqlite"])


def test_a_postgresql_claim_lost_to_a_race_is_told_by_the_claims_own_checks() -> None:
    own_task, *_, held, _lost_leases, _unknown, changed = claim_condition(CLAIM["postgresql"])
    assert f"{own_task} AND {held} AND {changed} AS raced" in CLAIM["postgresql"]


FENCED_WRITES = ["runs.checkpoint", "runs.finish", "runs.retry", "runs.release", "runs.hold"]


def test_every_fenced_write_is_fenced_by_the_run_the_token_the_owner_and_a_live_lease() -> None:
    fence = [
        "WHERE id = %s AND lease_token = %s AND owner = %s AND status = 'RUNNING'",
        "  AND lease_expires_at > {now}",
    ]
    fences = {
        (name, vendor): template.splitlines()[-2:]
        for name in FENCED_WRITES
        for vendor, template in STATEMENTS[name].template.items()
    }
    assert len(fences) == 2 * len(FENCED_WRITES)
    assert set(map(tuple, fences.values())) == {tuple(fence)}


def test_a_groups_file_is_read_as_named_statements_whose_own_line_comments_are_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(statements, "STATEMENTS", {})
    source = (
        "-- what the file holds\n\n"
        "-- one --\n-- what it does\nSELECT id\n  -- the rule a line keeps\n  FROM t\n\n"
        "-- two (sqlite) --\nSELECT {now}\n"
    )

    found = statements.parse("example", source)

    assert {name: sql.name for name, sql in found.items()} == {
        "one": "example.one",
        "two": "example.two",
    }
    assert found["one"].layout == dict.fromkeys(("postgresql", "sqlite"), "SELECT id\n  FROM t")
    assert found["two"].text == {"sqlite": "SELECT strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"}


def test_a_statement_written_twice_for_a_dialect_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(statements, "STATEMENTS", {})
    with pytest.raises(ValueError, match=r"example.one: written twice"):
        statements.parse("example", "-- one --\nSELECT 1\n\n-- one (sqlite) --\nSELECT 2\n")
