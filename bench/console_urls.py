"""The admin alone, for the list pages ``bench/ledger_scale.py`` times at two sizes, and
the router that points the ledger's models at the size being timed."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]


class LedgerOfTheSize:
    """The ledger's models read from :attr:`alias` while it is set (the admin's users
    and sessions stay on ``default``); unset, Django's own choice."""

    alias: str | None = None

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if model._meta.app_label == "celery_deadlines":
            return LedgerOfTheSize.alias
        return None

    db_for_write = db_for_read
