"""The base of every group of statements: the store's connection and dialect."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .connection import Store
    from .dialect import Dialect


class Statements:
    """Statements run on one :class:`~celery_deadlines.ledger.sql.connection.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def dialect(self) -> Dialect:
        return self.store.dialect

    def execute(
        self, sql: str, params: list[Any] | dict[str, Any], *, timed: bool = False
    ) -> tuple[int, list[tuple[Any, ...]]]:
        return self.store.execute(sql, params, timed=timed)
