"""DeadlineTask's ``__call__`` exists only where a ledger can be on (the Django app ready,
or :mod:`celery_deadlines.testing` imported): elsewhere Celery's tracer calls the task's
``run`` itself, as for a ``celery.Task`` (celery_deadlines.task.graft_call_onto_deadline_task).

Each case runs in a fresh interpreter: this suite's own process imported the testing
module long ago."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: An app with one DeadlineTask whose body reports the attempt it runs in.
APP = """
from celery import Celery
from celery.app.trace import build_tracer, task_has_custom

import time

from celery_deadlines import DEADLINE_HEADER, DeadlineTask
from celery_deadlines.core.propagation import HANDED

app = Celery("body-call", broker="memory://", set_as_current=True)
app.conf.update(task_always_eager=False)


def report(self):
    return {"remaining": self.remaining(), "deadline": self.deadline is not None}


app.task(base=DeadlineTask, bind=True, name="t.report", shared=False, budget=60)(report)
app.finalize(auto=True)
task = app.tasks["t.report"]


def with_deadline(seconds):
    return task.apply(headers={DEADLINE_HEADER: time.time() + seconds}).get()
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(APP) + textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_without_a_ledger_celerys_tracer_runs_the_body_and_the_attempt_keeps_its_deadline() -> None:
    done = run(
        """
        assert not task_has_custom(task, "__call__")
        result = with_deadline(30)  # apply builds a tracer as a worker does: no __call__ in it
        assert result["deadline"] and 0 < result["remaining"] <= 30, result
        assert HANDED.state is None  # nothing handed over: nobody would take it
        print("ok")
        """
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_without_a_ledger_a_deadline_not_clearly_in_time_is_judged_by_the_full_rule() -> None:
    done = run(
        """
        late = task.apply(headers={DEADLINE_HEADER: time.time() - 5})  # refused: no body
        garbage = task.apply(headers={DEADLINE_HEADER: "soon"})  # unreadable: refused
        # an eager refusal is the caller's failure, as Celery keeps any eager one
        reasons = (late.state, late.result.reason, garbage.state, garbage.result.reason)
        assert reasons == ("FAILURE", "deadline_passed", "FAILURE", "invalid_deadline"), reasons
        print("ok")
        """
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_importing_the_testing_module_gives_the_body_its_call_for_every_tracer_built_after() -> (
    None
):
    done = run(
        """
        import celery_deadlines.testing
        assert task_has_custom(task, "__call__")
        result = with_deadline(30)
        assert result["deadline"] and 0 < result["remaining"] <= 30, result
        assert HANDED.state is None  # taken by the body's call
        print("ok")
        """
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_django_app_gives_the_body_its_call_when_it_is_ready() -> None:
    done = run(
        """
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["celery_deadlines"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        )
        assert not task_has_custom(task, "__call__")
        django.setup()
        assert task_has_custom(task, "__call__")
        print("ok")
        """
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_ledger_that_turns_on_after_a_worker_built_a_tracer_is_a_configuration_error() -> None:
    done = run(
        """
        from celery_deadlines.errors import ConfigurationError
        task.__trace__ = build_tracer(task.name, task, app=app)  # as a worker does
        try:
            import celery_deadlines.testing
        except ConfigurationError as exc:
            print(exc)
        """
    )
    assert "a worker built the tracers of t.report before a ledger could turn on" in done.stdout, (
        done.stderr
    )
    assert "before the worker starts" in done.stdout
