"""What every page of the ledger's admin shares: read-only, the operator's name."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class ReadOnlyAdmin:
    """The ledger is written by its own statements only: no add, change or delete in
    the admin (viewing needs the model's view permission). Actions check their own
    permissions (``has_<name>_permission``)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def operator(request: HttpRequest) -> str:
    """Who acts, as the ledger records it."""
    user = request.user
    return f"operator {user.get_username()}" if user.is_authenticated else "an operator"
