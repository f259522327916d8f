"""The producer's statements: the outbox row before the message, and what is known of a
run id before it is published (a reused id is never silently another run).

Each statement's text is in ``outbox.sql``, under its name.
"""

from __future__ import annotations

from typing import Final

from ...rules.states import Status
from .rows import ExistingRun, NewRun, as_bytes
from .statements import Statements, queries

_SQL: Final = queries("outbox")
ENQUEUE: Final = _SQL["enqueue"]
RUN_ID: Final = _SQL["run_id"]
PUBLISH_FAILED: Final = _SQL["publish_failed"]
REOPEN_UNPUBLISHED: Final = _SQL["reopen_unpublished"]
RECORD_ENDED: Final = _SQL["record_ended"]
EXISTING: Final = _SQL["existing"]


class Outbox(Statements):
    """The run's row as the producer writes it (``DeadlineTask.apply_async``, beat)."""

    def enqueue(self, run: NewRun) -> bool:
        """Record a run before its message is published; ``False`` if the id exists."""
        d = self.dialect
        count, _ = self.execute(
            ENQUEUE.text[d.vendor],
            [
                run.task_id,
                run.task_name,
                d.param(run.deadline),
                d.param(run.delivery_deadline),
                run.root_id,
                run.parent_id,
                run.retries,
                run.message_body,
                run.content_type,
                run.content_encoding,
                d.param(run.available_at),
                d.param(run.not_before),
                run.schedule,
                run.schedule_zone,
                run.schedule_local,
                run.delivery_task or None,
                run.queue,
            ],
        )
        return count == 1

    def run_id(self, task_id: str) -> int | None:
        """The row id of ``task_id``'s run, if it has one."""
        _, rows = self.execute(RUN_ID.text[self.dialect.vendor], [task_id])
        return int(rows[0][0]) if rows else None

    def publish_failed(self, task_id: str, detail: str) -> bool:
        """End a run whose first publish raised: the caller was told, nothing will run."""
        d = self.dialect
        count, _ = self.execute(
            PUBLISH_FAILED.text[d.vendor],
            [detail, detail, task_id],
        )
        return count == 1

    def reopen_unpublished(self, run: NewRun) -> bool:
        """Record ``run`` again over a run of its id that was never sent (its publish
        raised, or the enqueue gate refused it: the caller was told, and tries again):
        QUEUED with the new message and deadlines. ``False`` if the run is anything else
        (it stands as it is)."""
        d = self.dialect
        count, _ = self.execute(
            REOPEN_UNPUBLISHED.text[d.vendor],
            [
                d.param(run.deadline),
                d.param(run.delivery_deadline),
                run.message_body,
                run.content_type,
                run.content_encoding,
                d.param(run.available_at),
                run.task_id,
                run.task_name,
            ],
        )
        return count == 1

    def record_ended(
        self,
        run: NewRun,
        status: Status,
        reason: str,
        detail: str,
        op: str,
        *,
        published: bool = False,
    ) -> bool:
        """Insert ``run`` already ended (never claimed); ``False`` if the id exists."""
        d = self.dialect
        count, _ = self.execute(
            RECORD_ENDED.text[d.vendor],
            [
                run.task_id,
                run.task_name,
                status.value,
                reason,
                detail,
                d.param(run.deadline),
                run.root_id,
                run.parent_id,
                run.retries,
                published,
                op,
                detail,
                d.param(run.not_before),
                run.schedule,
                run.schedule_zone,
                run.schedule_local,
            ],
        )
        return count == 1

    def existing(self, task_id: str) -> ExistingRun | None:
        """The run already recorded under ``task_id``, if any: its task, status and
        recorded message (to tell a repeated publish from another run reusing the id)."""
        _, rows = self.execute(
            EXISTING.text[self.dialect.vendor],
            [task_id],
        )
        if not rows:
            return None
        name, status, body, content_type, encoding = rows[0]
        return ExistingRun(
            task_id=task_id,
            task_name=name,
            status=status,
            message_body=as_bytes(body),
            content_type=content_type,
            content_encoding=encoding,
        )
