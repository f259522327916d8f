"""The docs name what the code has: every setting is in the settings reference; the
README stays a front door whose two commands are the Makefile's and CI's."""

from __future__ import annotations

import re
from pathlib import Path

from celery_deadlines.conf import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "settings.md"
README = ROOT / "README.md"


def test_every_setting_is_in_the_settings_reference_in_both_spellings() -> None:
    text = REFERENCE.read_text()
    missing = [
        setting.name
        for setting in SETTINGS
        if f"`{setting.name}`" not in text or f"`{setting.django_name}`" not in text
    ]
    assert missing == []


def test_the_readme_is_a_front_door_of_at_most_8_kb() -> None:
    assert len(README.read_bytes()) <= 8 * 1024


def test_the_readmes_two_commands_are_make_targets_and_ci_runs_the_test_command() -> None:
    section = README.read_text().split("## The two commands")[1].split("\n## ")[0]
    [block] = re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: ", makefile, re.M)
    assert re.search(r"^test: ", makefile, re.M)
    assert "make --no-print-directory test\n" in (ROOT / ".ci" / "run").read_text()


def test_the_readmes_links_into_the_docs_name_pages_that_exist() -> None:
    targets = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", README.read_text())
    assert targets
    assert [target for target in targets if not (ROOT / target).is_file()] == []


def test_every_system_check_id_the_package_reports_is_in_the_reference() -> None:
    package = ROOT / "celery_deadlines"
    ids = {
        found
        for path in package.rglob("*.py")
        for found in re.findall(r"celery_deadlines\.[EW]\d{3}", path.read_text())
    }
    assert len(ids) > 10
    text = REFERENCE.read_text()
    assert sorted(check for check in ids if check not in text) == []
