"""The run ledger's tables: one :class:`Run` per task id, and its :class:`RunEvent` audit.

Every write to a run goes through :mod:`celery_deadlines.ledger.store` as one
conditional statement evaluated against the database clock; a trigger created by the
migrations appends a :class:`RunEvent` for every row it changes, in the same statement,
so the history cannot miss a transition. Index and constraint names are explicit, so
the schema does not depend on the project's ``DEFAULT_AUTO_FIELD`` or Django's hashing.
"""

from __future__ import annotations

from django.db import models

from .rules.states import (
    EFFECT_LABELS,
    STATUS_LABELS,
    TERMINAL,
    EffectState,
    Status,
    choices,
)

#: The ended statuses, in the order the ledger's SQL lists them (the purge's index).
ENDED = [status.value for status in Status if status in TERMINAL]

__all__ = ["TERMINAL", "Effect", "EffectState", "Run", "RunEvent", "RunPlan", "Status"]


class Run(models.Model):
    """One task id's run: its deadline, its current lease and its last checkpoint."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(max_length=255)
    task_name = models.CharField(max_length=255)
    status = models.CharField(
        max_length=16, choices=choices(Status, STATUS_LABELS), default=Status.QUEUED
    )
    reason = models.CharField(max_length=64, blank=True, default="")
    detail = models.TextField(blank=True, default="")

    deadline = models.DateTimeField(null=True, blank=True)
    delivery_deadline = models.DateTimeField(null=True, blank=True)
    # A delivery task's run (``deadline_kind = "delivery"``): its deadline is the delivery
    # deadline, and it expires as ``delivery_expired`` whoever finds it past (NULL: no).
    delivery_task = models.BooleanField(null=True, blank=True)
    # The queue Celery routed the run's message to when it was first published (NULL for
    # runs recorded before the column, or without a message): the admin filters on it.
    queue = models.CharField(max_length=255, null=True, blank=True)
    root_id = models.CharField(max_length=255, blank=True, default="")
    # A scheduled run's occurrence (docs/explanation/time-contracts.md, schedules): resolved to
    # UTC before the run existed, stored with the zone and local wall time it came from; its
    # window is [not_before, deadline). NULL for unscheduled runs (nullable, so that adding the
    # columns does not rebuild the table under its audit triggers on SQLite).
    not_before = models.DateTimeField(null=True, blank=True)
    schedule = models.CharField(max_length=255, null=True, blank=True)
    schedule_zone = models.CharField(max_length=64, null=True, blank=True)
    schedule_local = models.CharField(
        max_length=32, null=True, blank=True, help_text="Local wall time, ISO 8601."
    )
    parent_id = models.CharField(max_length=255, blank=True, default="")

    # The retry number the next claim must carry: an older message is stale.
    retries = models.IntegerField(default=0)
    attempt = models.IntegerField(default=0, help_text="Claims won so far.")
    lost_leases = models.IntegerField(default=0, help_text="Leases that expired while running.")
    owner = models.CharField(max_length=255, blank=True, default="")
    lease_token = models.BigIntegerField(default=0, help_text="Fencing token of the last claim.")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    version = models.BigIntegerField(default=0, help_text="Incremented by every write.")

    checkpoint_name = models.CharField(max_length=255, blank=True, default="")
    checkpoint_data = models.JSONField(null=True, blank=True)
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    checkpoint_token = models.BigIntegerField(null=True, blank=True)

    # The outbox: what to publish again if the broker lost the message.
    message_body = models.BinaryField(null=True, blank=True)
    content_type = models.CharField(max_length=128, blank=True, default="")
    content_encoding = models.CharField(max_length=64, blank=True, default="")
    available_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)

    # A success's return value, encoded with the result serializer (bounded; none for an
    # ignore_result task): what a redelivery tells a caller its ended attempt never told.
    result = models.BinaryField(null=True, blank=True)
    result_content_type = models.CharField(max_length=128, null=True, blank=True)
    result_encoding = models.CharField(max_length=64, null=True, blank=True)
    # A failed body's traceback, bounded (rules.outcomes.TRACEBACK_LIMIT), written with the
    # run's end: what the run's page and explain show (migration 0011).
    traceback = models.TextField(
        null=True, blank=True, help_text="A failed body's traceback, bounded."
    )

    # The last write: what it was (copied into its RunEvent by the audit trigger).
    op = models.CharField(max_length=32, default="enqueue")
    op_detail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            # with the pattern operator class on PostgreSQL: the same uniqueness, and a
            # search by the start of a task id (the list's short id) reads a range of it
            # whatever the collation (migration 0010; ignored by SQLite)
            models.UniqueConstraint(
                fields=["task_id"],
                name="cdl_run_task_id_uniq",
                opclasses=["varchar_pattern_ops"],
            ),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="cdl_run_status_lease_idx"),
            models.Index(fields=["root_id"], name="cdl_run_root_idx"),
            models.Index(fields=["parent_id"], name="cdl_run_parent_idx"),
            # the purge's batches: ended runs, oldest first (partial, so a run enters it
            # once, with its last write; migration 0007)
            models.Index(
                fields=["updated_at"],
                condition=models.Q(status__in=ENDED),
                name="cdl_run_ended_idx",
            ),
            # the admin's list pages at any size (migration 0010): newest first, the date
            # hierarchy, and each filter's choices (a loose index scan) and pages
            models.Index(fields=["created_at"], name="cdl_run_created_idx"),
            models.Index(fields=["task_name", "created_at"], name="cdl_run_task_name_idx"),
            models.Index(fields=["queue", "created_at"], name="cdl_run_queue_idx"),
            # partial: a run without a reason (one that succeeds) never enters it
            models.Index(
                fields=["reason", "created_at"],
                condition=~models.Q(reason=""),
                name="cdl_run_reason_idx",
            ),
        ]
        permissions = [
            ("expire_run", "Can expire an unfinished run"),
            ("requeue_run", "Can requeue a run whose deadline allows it"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] {self.status}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


class RunEvent(models.Model):
    """One compare-and-swap on a run: applied (by the trigger) or rejected (by the store)."""

    class Outcome(models.TextChoices):
        APPLIED = "applied", "applied"
        REJECTED = "rejected", "rejected"

    id = models.BigAutoField(primary_key=True)
    # Not checked by PostgreSQL (migration 0012; SQLite keeps its check): every event is
    # written with its run's id read by the same statement, which keeps that row to its
    # commit where it read it from its snapshot (``{run_kept}`` in the ledger's SQL), and
    # runs are deleted after their events (Django's cascade, the purge). The check cost
    # every transition a lookup at commit and a lock on the run's row.
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="events",
        db_index=False,
        db_constraint=False,
    )
    at = models.DateTimeField(help_text="Database clock.")
    kind = models.CharField(max_length=32)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    status = models.CharField(max_length=16, choices=choices(Status, STATUS_LABELS))
    reason = models.CharField(max_length=64, blank=True, default="")
    version = models.BigIntegerField()
    lease_token = models.BigIntegerField()
    owner = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    detail = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["run", "id"], name="cdl_event_run_idx")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.outcome} v{self.version} t{self.lease_token}"


class Effect(models.Model):
    """One side effect, at most once per key: intent, dispatch, outcome, evidence."""

    class Kind(models.TextChoices):
        EXECUTION = "execution", "execution"
        DELIVERY = "delivery", "delivery"

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=255)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="effects", db_index=False)
    name = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.EXECUTION)
    state = models.CharField(
        max_length=20,
        choices=choices(EffectState, EFFECT_LABELS),
        default=EffectState.INTENT_RECORDED,
    )
    lease_token = models.BigIntegerField(help_text="Token of the attempt that last acted on it.")
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the request's parameters.")
    dispatches = models.IntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    evidence = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    # An attempt found the key recorded (its outcome replayed, or its intent found
    # again): the purge keeps the effect while this is within the retention (NULL:
    # never; nullable, so that adding it does not rebuild the table; migration 0007).
    asked_at = models.DateTimeField(
        null=True, blank=True, help_text="Database clock: the last attempt that found the key."
    )
    # Who settled the last dispatch (an operator in the admin, a worker's reconciler);
    # the next dispatch clears it. The audit trigger records it as the settlement event's
    # owner, so the history credits the one who settled (migration 0011).
    settled_by = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="Who settled the last dispatch (an operator, a reconciler).",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key"], name="cdl_effect_key_uniq")]
        indexes = [
            models.Index(fields=["run", "id"], name="cdl_effect_run_idx"),
            models.Index(fields=["state"], name="cdl_effect_state_idx"),
            # the admin's effect list: its filters' choices and pages (migration 0010)
            models.Index(fields=["name", "id"], name="cdl_effect_name_idx"),
            models.Index(fields=["kind", "id"], name="cdl_effect_kind_idx"),
        ]
        permissions = [("resolve_effect", "Can resolve an unknown effect with evidence")]

    def __str__(self) -> str:
        return f"{self.name}[{self.key}] {self.state}"


class PlanState(models.TextChoices):
    """Where a stored plan is: the one a run follows, or history."""

    ACTIVE = "ACTIVE", "active"
    SUPERSEDED = "SUPERSEDED", "superseded by a newer plan"
    INVALIDATED = "INVALIDATED", "invalidated on resume"


class RunPlan(models.Model):
    """A plan a run made (:class:`celery_deadlines.rules.plans.Plan`), kept after it stops
    applying: a run has at most one ACTIVE plan, and an invalidated one is never
    executed again, only read (an invalidated plan is evidence)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="plans", db_index=False)
    plan_id = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=16, choices=PlanState.choices, default=PlanState.ACTIVE)
    document = models.JSONField(help_text="The plan as it was made (Plan.to_json()).")
    lease_token = models.BigIntegerField(help_text="Token of the attempt that made it.")
    reason = models.CharField(max_length=64, blank=True, default="")
    detail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(help_text="Database clock.")
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run"],
                condition=models.Q(state="ACTIVE"),
                name="cdl_plan_one_active",
            )
        ]
        indexes = [models.Index(fields=["run", "id"], name="cdl_plan_run_idx")]

    def __str__(self) -> str:
        return f"plan {self.plan_id or self.id} of run {self.run_id} {self.state}"
