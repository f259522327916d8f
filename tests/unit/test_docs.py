"""The docs name what the code has: every setting is in the settings reference."""

from __future__ import annotations

from pathlib import Path

from celery_deadlines.conf import SETTINGS

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"


def test_every_setting_is_in_the_settings_reference_in_both_spellings() -> None:
    text = REFERENCE.read_text()
    missing = [
        setting.name
        for setting in SETTINGS
        if f"`{setting.name}`" not in text or f"`{setting.django_name}`" not in text
    ]
    assert missing == []
