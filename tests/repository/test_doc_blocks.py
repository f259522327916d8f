"""Every ```python block of the README and docs/ runs as written, imports included.

Each block is parsed, and every import in it resolves. A name a block uses without
binding it must be one of the reader's own objects listed in ``STAND_INS`` (the
project's Celery app, the shop's tasks and providers the examples talk about): never a
name of this library, Celery, Django or the standard library, which the block imports.
Then the block runs:

* a settings block (top-level assignments to upper-case names, as in ``settings.py``)
  runs, and its ``CELERY_DEADLINES_*`` values must pass the settings' checks and be
  known names;
* a block of definitions (imports, functions, tasks, signal handlers, plain
  assignments) runs against a scratch Celery app, its tasks created for real (so a task
  option this library rejects fails here);
* a block that calls things at its top level (publishes a task, waits for a result,
  serves metrics) needs a broker and a worker: it runs in the integration tier,
  against Redis and a real worker (tests/repository/test_doc_blocks_run.py), and the
  quick start's blocks in the project its page builds (tests/repository/test_quickstart.py).

A block that is deliberately a fragment is preceded by ``<!-- fragment: why -->``; it is
parsed and its imports checked, nothing more. There are at most ``MAX_FRAGMENTS``.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from celery import Celery, Task
from celery import _state as celery_state
from celery.local import Proxy

import celery_deadlines
from celery_deadlines.checks import closest_setting
from celery_deadlines.conf import SETTINGS, Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The README and every page of the site (docs/, its built copy in docs/_build aside)
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts),
]
FENCE = re.compile(
    r"^(?:<!-- fragment: (?P<why>[^>]+) -->\n)?```python\n(?P<code>.*?)^```", re.M | re.S
)
MAX_FRAGMENTS = 3

#: Names the examples use as the reader's own objects, never imported by them.
STAND_INS: dict[str, str] = {
    "app": "the project's Celery app (the quick start's mysite/celery.py)",
    "result": "an AsyncResult the caller holds",
    "request_deadline": "an aware datetime the caller already has",
    "ProviderDown": "the reader's exception for an unavailable provider",
    "carrier": "a shipping provider's client",
    "provider": "a payment provider's client",
    "mailer": "a mail provider's client",
    "pager": "an alerting client",
    "fulfilment": "the fulfilment service's client",
    "orders": "the shop's order repository",
    "Order": "the shop's Django model",
    "order": "an order the view holds",
    "items": "the order's items",
    "ship": "the shop's task (defined in 'Give a task a deadline')",
    "reserve": "the shop's task",
    "reserve_slot": "the shop's task",
    "confirm": "the shop's task",
    "charge": "the shop's task (defined in 'The effect ledger')",
    "notify_customer": "the shop's task",
    "fetch": "the shop's task",
    "merge": "the shop's task",
    "urls": "the pages to fetch",
    "pages": "the pages to load",
    "load": "the reader's function",
    "confirmation_id": "the id the customer confirmed",
    "log": "the reader's logger",
    "statsd": "the reader's metrics client",
}

#: Modules of the quick start's own project (mysite, its app shop): not importable here.
PROJECT_MODULES = {"mysite", "shop"}

#: Names the library, Celery, Django and the standard library provide: a block imports them.
PROVIDED = (
    set(celery_deadlines.__all__)
    | {"Celery", "shared_task", "chord", "group", "chain", "signature", "current_app"}
    | {"transaction", "settings", "timedelta", "datetime", "timezone", "time", "os"}
    | {"Found", "NotFound", "metrics", "FakeClock", "FakeLedger", "use_clock", "use_ledger"}
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    fragment: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def page_name(page: Path) -> str:
    """``README.md``, or a page's path in the site (``howto/testing.md``)."""
    return page.name if page.parent == ROOT else str(page.relative_to(DOCS))


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start("code"))
            found.append(Block(page_name(page), line, match["code"], match["why"]))
    return found


BLOCKS = blocks()


def bound_names(tree: ast.AST) -> set[str]:
    names = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def unbound(tree: ast.AST) -> set[str]:
    used = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    return used - bound_names(tree)


def is_settings(tree: ast.Module) -> bool:
    def assigns_a_setting(node: ast.stmt) -> bool:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        return bool(targets) and all(isinstance(t, ast.Name) and t.id.isupper() for t in targets)

    statements = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    return bool(statements) and all(assigns_a_setting(n) for n in statements)


def only_definitions(tree: ast.Module) -> bool:
    """Definitions a module runs at import; a relative import (a package's
    ``__init__.py``) needs its package, so such a block is only checked."""
    allowed = (
        ast.Import,
        ast.ImportFrom,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Assign,
    )
    relative = any(isinstance(node, ast.ImportFrom) and node.level for node in tree.body)
    return not relative and all(isinstance(node, allowed) for node in tree.body)


def test_the_docs_have_python_blocks_and_few_fragments() -> None:
    assert len(BLOCKS) > 30
    fragments = [f"{block}: {block.fragment}" for block in BLOCKS if block.fragment]
    assert len(fragments) <= MAX_FRAGMENTS, fragments


def test_no_stand_in_is_a_name_the_block_should_import() -> None:
    assert STAND_INS.keys() & PROVIDED == set()


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_a_doc_block_parses_and_its_imports_resolve(block: Block) -> None:
    tree = ast.parse(block.code, filename=str(block))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] not in PROJECT_MODULES
        ):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.import_module(
                    f"{node.module}.{alias.name}"
                ), f"{block}: {node.module}.{alias.name}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.fragment], ids=str)
def test_a_doc_block_imports_every_name_it_does_not_define(block: Block) -> None:
    missing = unbound(ast.parse(block.code)) - STAND_INS.keys()
    assert missing == set(), f"{block} uses {sorted(missing)} without importing them"


SETTINGS_BLOCKS = [b for b in BLOCKS if not b.fragment and is_settings(ast.parse(b.code))]


@pytest.mark.parametrize("block", SETTINGS_BLOCKS, ids=str)
def test_a_settings_block_runs_and_its_values_pass_the_checks(block: Block) -> None:
    namespace: dict[str, Any] = {"INSTALLED_APPS": ["django.contrib.admin"]}
    exec(compile(block.code, str(block), "exec"), namespace)
    given = {
        name[len("CELERY_") :].lower(): value
        for name, value in namespace.items()
        if name.startswith("CELERY_DEADLINES_")
    }
    known = {setting.name for setting in SETTINGS}
    unknown = {name: closest_setting(name) for name in given.keys() - known}
    assert unknown == {}
    assert [str(error) for error in Settings(given).check()] == []


def scratch_namespace(block: Block) -> dict[str, Any]:
    app = Celery("docs", set_as_current=False, broker="memory://", backend="cache+memory://")
    namespace: dict[str, Any] = {name: mock.MagicMock(name=name) for name in STAND_INS}
    namespace["__name__"] = re.sub(r"\W", "_", f"docs_{block}")  # the tasks' module
    namespace["app"] = app
    namespace["ProviderDown"] = type("ProviderDown", (Exception,), {})
    return namespace


DEFINITION_BLOCKS = [
    b
    for b in BLOCKS
    if not b.fragment and b not in SETTINGS_BLOCKS and only_definitions(ast.parse(b.code))
]


@pytest.mark.parametrize("block", DEFINITION_BLOCKS, ids=str)
def test_a_block_of_definitions_runs_and_its_tasks_are_created(block: Block) -> None:
    namespace = scratch_namespace(block)
    app: Celery = namespace["app"]
    # app.task and shared_task register their tasks with every app finalized later (and
    # shared_task with every live one): keep them to this test's app
    registered: set[Any] = celery_state._on_app_finalizers  # type: ignore[attr-defined]
    finalizers = set(registered)
    previous = celery_state.get_current_app()
    try:
        with mock.patch.object(celery_state, "_get_active_apps", return_value=[app]):
            app.set_current()
            exec(compile(block.code, str(block), "exec"), namespace)
            app.finalize(auto=True)
            defined = {
                f"{namespace['__name__']}.{name}"
                for name, value in namespace.items()
                if isinstance(value, (Task, Proxy))
            }
    finally:
        registered.intersection_update(finalizers)
        previous.set_current()
    declared = {name for name in app.tasks if name.startswith("docs_")}
    assert declared == defined


SHELL = re.compile(r"^```(?:bash|sh|console|shell)\n(?P<code>.*?)^```", re.M | re.S)


def shell_commands(program: str) -> list[tuple[str, list[str]]]:
    """``(page, argv after the program)`` of each shell line running ``program``."""
    found = []
    for page in PAGES:
        for match in SHELL.finditer(page.read_text()):
            for line in match["code"].splitlines():
                command = re.split(r"\s#|\||&&", line.removeprefix("$ "))
                words = shlex.split(command[0] if program in command[0] else "")
                if program in words:
                    found.append((page_name(page), words[words.index(program) + 1 :]))
    return found


#: startapp is Django's own and runs before the project's app exists
MANAGE_PY = [argv for _, argv in shell_commands("manage.py") if argv[0] != "startapp"]


@pytest.mark.parametrize("argv", MANAGE_PY, ids=" ".join)
def test_a_manage_py_command_in_the_docs_exists_with_its_options(argv: list[str]) -> None:
    from django.core.management import get_commands, load_command_class

    name, *arguments = argv
    app = get_commands()[name]  # KeyError: no such command
    command = load_command_class(app, name)
    arguments = ["123" if arg == "<id>" else arg for arg in arguments]
    command.create_parser("manage.py", name).parse_args(arguments)  # CommandError if wrong


#: What a class a command names may need that a test environment may lack.
OPTIONAL_DEPENDENCIES = frozenset({"django_celery_beat"})


def test_the_celery_commands_in_the_docs_exist_and_name_classes_that_import() -> None:
    from celery.bin.celery import celery
    from celery.utils.imports import symbol_by_name

    commands = [argv for _, argv in shell_commands("celery")]
    subcommands = {argv[argv.index("-A") + 2] for argv in commands}
    assert "worker" in subcommands
    assert subcommands <= set(celery.commands)
    # a scheduler or pool class a command names (``beat -S module:Class``) exists
    named = [argv[argv.index(flag) + 1] for argv in commands for flag in ("-S",) if flag in argv]
    for path in named:
        try:
            named_class = symbol_by_name(path)
        except ModuleNotFoundError as missing:
            if missing.name in OPTIONAL_DEPENDENCIES:
                continue  # (the matrix runs without django-celery-beat)
            raise
        assert isinstance(named_class, type), path
