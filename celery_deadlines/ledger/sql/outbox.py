"""The producer's statements: the outbox row before the message, and what is known of a
run id before it is published (a reused id is never silently another run).
"""

from __future__ import annotations

from ...rules.states import Status
from .predicates import RUN
from .rows import ExistingRun, NewRun, as_bytes
from .statements import Statements


class Outbox(Statements):
    """The run's row as the producer writes it (``DeadlineTask.apply_async``, beat)."""

    def enqueue(self, run: NewRun) -> bool:
        """Record a run before its message is published; ``False`` if the id exists."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            INSERT INTO {RUN} (
                task_id, task_name, status, reason, detail, deadline, delivery_deadline,
                root_id, parent_id, retries, attempt, lost_leases, owner, lease_token,
                version, checkpoint_name, message_body, content_type, content_encoding,
                available_at, published_at, op, op_detail, created_at, updated_at,
                not_before, schedule, schedule_zone, schedule_local, delivery_task, queue
            ) VALUES (
                %s, %s, 'QUEUED', '', '', %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', %s, %s, %s,
                %s, {d.now}, 'enqueue', '', {d.now}, {d.now}, %s, %s, %s, %s, %s, %s
            )
            ON CONFLICT (task_id) DO NOTHING
            """,
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
        _, rows = self.execute(f"SELECT id FROM {RUN} WHERE task_id = %s", [task_id])
        return int(rows[0][0]) if rows else None

    def publish_failed(self, task_id: str, detail: str) -> bool:
        """End a run whose first publish raised: the caller was told, nothing will run."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = 'FAILED', reason = 'publish_failed', detail = %s,
                version = version + 1, op = 'publish_failed', op_detail = %s,
                updated_at = {d.now}
            WHERE task_id = %s AND status = 'QUEUED' AND attempt = 0
            """,
            [detail, detail, task_id],
        )
        return count == 1

    def reopen_unpublished(self, run: NewRun) -> bool:
        """Record ``run`` again over a run of its id whose publish raised (the caller was
        told nothing was sent, and tries again): QUEUED with the new message and
        deadlines. ``False`` if the run is anything else (it stands as it is)."""
        d = self.dialect
        count, _ = self.execute(
            f"""
            UPDATE {RUN} SET status = 'QUEUED', reason = '', detail = '',
                deadline = %s, delivery_deadline = %s, message_body = %s,
                content_type = %s, content_encoding = %s, available_at = %s,
                published_at = {d.now}, version = version + 1, op = 'enqueue',
                op_detail = 'published again after a failed publish', updated_at = {d.now}
            WHERE task_id = %s AND task_name = %s AND status = 'FAILED'
              AND reason = 'publish_failed' AND attempt = 0
            """,
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
        published_at = d.now if published else "NULL"
        count, _ = self.execute(
            f"""
            INSERT INTO {RUN} (
                task_id, task_name, status, reason, detail, deadline, root_id, parent_id,
                retries, attempt, lost_leases, owner, lease_token, version, checkpoint_name,
                content_type, content_encoding, published_at, op, op_detail, created_at,
                updated_at, not_before, schedule, schedule_zone, schedule_local
            ) VALUES (
                %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, '', 0, 0, '', '', '', {published_at},
                %s, %s, {d.now}, {d.now}, %s, %s, %s, %s
            )
            ON CONFLICT (task_id) DO NOTHING
            """,
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
            f"""
            SELECT task_name, status, message_body, content_type, content_encoding
            FROM {RUN} WHERE task_id = %s
            """,
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
