"""The workers' dedicated ledger connection: kept open, and on PostgreSQL prepared."""

from __future__ import annotations

from celery_deadlines.ledger.sql.connection import PREPARE_THRESHOLD, dedicated_settings

POSTGRESQL = {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "CONN_MAX_AGE": 0}


def test_a_dedicated_postgresql_connection_binds_on_the_server_and_prepares() -> None:
    settings = dedicated_settings({**POSTGRESQL, "OPTIONS": {"sslmode": "prefer"}})
    assert settings["CONN_MAX_AGE"] is None
    assert settings["OPTIONS"] == {
        "sslmode": "prefer",
        "server_side_binding": True,
        "prepare_threshold": PREPARE_THRESHOLD,
    }


def test_options_that_say_how_to_prepare_or_bind_are_kept_as_given() -> None:
    for given in (
        {"prepare_threshold": None},
        {"server_side_binding": False},
        {"server_side_binding": True, "prepare_threshold": None},
        {"server_side_binding": True, "prepare_threshold": 5},
    ):
        assert dedicated_settings({**POSTGRESQL, "OPTIONS": given})["OPTIONS"] == given


def test_binding_on_the_server_alone_still_prepares_the_statements() -> None:
    # Django prepares nothing unless prepare_threshold is given: without this, an alias
    # tuned with server_side_binding planned the claim afresh at every task
    given = {"server_side_binding": True}
    assert dedicated_settings({**POSTGRESQL, "OPTIONS": given})["OPTIONS"] == {
        "server_side_binding": True,
        "prepare_threshold": PREPARE_THRESHOLD,
    }


def test_a_dedicated_sqlite_connection_keeps_its_options() -> None:
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:", "OPTIONS": {}}
    assert dedicated_settings(sqlite)["OPTIONS"] == {}


def test_the_alias_settings_are_not_changed() -> None:
    options = {"sslmode": "prefer"}
    dedicated_settings({**POSTGRESQL, "OPTIONS": options})
    assert options == {"sslmode": "prefer"}


def test_djangos_connection_pool_is_left_to_the_alias() -> None:
    pooled = {**POSTGRESQL, "OPTIONS": {"pool": {"min_size": 2}, "sslmode": "prefer"}}
    settings = dedicated_settings(pooled)
    assert "pool" not in settings["OPTIONS"]
    assert settings["OPTIONS"]["sslmode"] == "prefer"
    assert pooled["OPTIONS"] == {"pool": {"min_size": 2}, "sslmode": "prefer"}


def test_a_pool_switched_off_is_dropped_too() -> None:
    settings = dedicated_settings({**POSTGRESQL, "OPTIONS": {"pool": False}})
    assert "pool" not in settings["OPTIONS"]


def test_a_dedicated_connection_commits_its_statements_whatever_the_alias_says() -> None:
    manual = {**POSTGRESQL, "AUTOCOMMIT": False}
    assert dedicated_settings(manual)["AUTOCOMMIT"] is True
    assert manual["AUTOCOMMIT"] is False
