"""docs/quickstart.md, followed as a newcomer follows it: from an empty directory to a
first run the ledger explains, in a virtualenv of its own where the package is installed
from a checkout, as the page's first step says (this checkout: the reader's).

The page is read, not copied: each ```python block is written to the file the sentence
before it names (a settings block "at the end of" a file is appended to it), or typed
into ``manage.py shell`` when that sentence says so; each ```bash line runs in the
project's directory, the worker in the background, ``<id>`` replaced by each id the
shell printed. Only what cannot run in a test is skipped, each with its reason in
``NOT_RUN``. So a step the page forgets, a file it names wrong or a command that no
longer works fails here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Both tests read one followed quick start (a fresh venv and a worker): one xdist worker
# runs them, so it is followed once.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("quickstart")]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
BLOCK = re.compile(r"^```(?P<lang>\w+)\n(?P<code>.*?)^```", re.M | re.S)
#: Lines of the page's shell blocks a test does not run, and why.
NOT_RUN = {
    "createsuperuser": "interactive; the admin's pages are rendered by tests/django",
    "runserver": "serves until stopped; the admin's pages are rendered by tests/django",
}
#: How long one step may take on a busy machine (a migrate, a worker's start, the
#: install: about 15 s on an idle one).
STEP_TIMEOUT = 180
#: The checkout the page's first step installs from (``export CELERY_DEADLINES=...``).
CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Step:
    lang: str
    code: str
    said_before: str  # the page's text between the previous block and this one


def steps() -> list[Step]:
    text = PAGE.read_text()
    found, end = [], 0
    for match in BLOCK.finditer(text):
        found.append(Step(match["lang"], match["code"], text[end : match.start()]))
        end = match.end()
    return found


@dataclass
class Project:
    root: Path
    env: dict[str, str]
    worker: subprocess.Popen[bytes] | None = None
    shell_output: str = ""
    explained: list[str] = field(default_factory=list)  # `deadlines explain` per id

    def run(self, command: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.root,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"`{command}` failed ({done.returncode}):\n{output}"
        return output

    def write(self, step: Step) -> None:
        """A python block: to the file its sentence names, or into ``manage.py shell``."""
        if "manage.py shell" in step.said_before:
            self.shell_output += self.run("python manage.py shell", stdin=step.code)
            return
        named = re.findall(r"`([\w/]+\.py)`", step.said_before)
        assert named, f"the page does not say where this block goes:\n{step.code}"
        path = self.root / named[-1]
        assert path.parent.is_dir(), f"{named[-1]}: the page never created {path.parent.name}/"
        if "at the end of" in step.said_before.lower():
            path.write_text(path.read_text() + "\n" + step.code)
        else:
            path.write_text(step.code)

    def shell_lines(self, step: Step) -> None:
        for line in step.code.splitlines():
            if not line.strip() or any(skipped in line for skipped in NOT_RUN):
                continue
            exported = re.match(r"export (\w+)=", line)
            if exported:  # the reader names their sdist or checkout: this one
                self.env[exported[1]] = str(CHECKOUT)
            elif ". .venv/bin/activate" in line:
                self.run(line)  # makes the virtualenv; what activating it does, for the rest
                self.env["VIRTUAL_ENV"] = str(self.root / ".venv")
                self.env["PATH"] = f"{self.root / '.venv' / 'bin'}{os.pathsep}{self.env['PATH']}"
            elif re.search(r"\bcelery\b.* worker\b", line):
                self.start_worker(line)
            elif "<id>" in line:
                ids = re.findall(r"^([0-9a-f-]{36}) ", self.shell_output, re.M)
                assert ids, f"no id printed to use in `{line}`:\n{self.shell_output}"
                self.explained = [self.run(line.replace("<id>", run_id)) for run_id in ids]
            else:
                self.run(line)

    def start_worker(self, line: str) -> None:
        with (self.root / "worker.log").open("wb") as log:  # the worker keeps its own copy
            self.worker = subprocess.Popen(
                ["bash", "-c", f"exec {line}"],
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop_worker(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()

    def worker_log(self) -> str:
        path = self.root / "worker.log"
        return path.read_text(errors="replace") if path.exists() else "(no worker log)"


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """The quick start, every step of it done in a new directory."""
    env = {
        name: value
        for name, value in os.environ.items()
        # the suite's own Django settings and Celery knobs are not the newcomer's
        if name != "DJANGO_SETTINGS_MODULE" and not name.startswith(("CELERY", "TEST_"))
    }
    env.pop("VIRTUAL_ENV", None)  # the suite's: the page makes the reader's own
    env["PATH"] = os.pathsep.join(
        folder
        for folder in env.get("PATH", "").split(os.pathsep)
        if Path(folder) != Path(sys.executable).parent
    )
    project = Project(tmp_path_factory.mktemp("quickstart"), env)
    try:
        for step in steps():
            if step.lang == "python":
                project.write(step)
            elif step.lang == "bash":
                project.shell_lines(step)
        yield project
    except BaseException:
        print(project.worker_log())
        raise
    finally:
        project.stop_worker()


def test_the_quick_start_runs_the_first_task_and_the_late_call_is_refused_at_the_claim_gate(
    followed: Project,
) -> None:
    # what the block prints, each line starting with a run's id (Django's shell may say
    # first which objects it imported)
    lines = re.findall(r"^[0-9a-f-]{36} .*$", followed.shell_output, re.M)
    assert len(lines) == 2, followed.shell_output + followed.worker_log()
    # the page: "between 7 and 8 s to spare"; a busy machine may take longer to pick it up
    first = re.fullmatch(r"\S+ order 42 shipped with (\d+\.\d) s to spare", lines[0])
    assert first is not None, lines[0]
    assert 0 < float(first[1]) <= 8  # 10 s budget, 2 s of work
    assert re.fullmatch(r"\S+ claim deadline_passed", lines[1]), lines[1]


def test_the_quick_start_explains_both_runs_from_the_ledger(followed: Project) -> None:
    shipped, refused = followed.explained
    assert "status             SUCCEEDED" in shipped
    # the page names the two who may find the deadline gone: the claim gate, or the
    # worker's reconciler when its pass (every 10 s) falls before the claim
    assert re.search(
        r"EXPIRED \(deadline_passed: (claim gate refused: deadline_passed"
        r"|the deadline passed before any worker claimed the run\))",
        refused,
    ), refused
    assert "never claimed" in refused
