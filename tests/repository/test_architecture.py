"""The package's tiers, held: what each module may import and who may read the clock.

Walks every module of the package (migrations aside) with ``ast``, counting every
import, function-local ones too (a lazy import hides a dependency, it does not remove
it); imports under ``if TYPE_CHECKING:`` are for the type checker only and are not
counted. A module's tier is where it lives, and every module lives in one: a folder
(``rules/`` the pure rules, ``core/`` the Celery tier, ``contrib/`` the integrations,
``ledger/`` the ledger, ``admin/``, ``explain/``, ``management/`` the Django app), or a
root module named below (the foundation every tier stands on, the public surface, the
Django app under Django's names). A new module at the root has no tier until it is
named here: the root is no default bin. DEVELOPERS.md, "The tiers", is the map.

Only ``clock`` reads the time (the crash points, inert test hooks, aside).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_deadlines"

#: The folders that are tiers.
FOLDERS = {
    "rules": "pure",
    "core": "celery",
    "contrib": "contrib",
    "ledger": "ledger",
    "admin": "django",
    "explain": "django",
    "management": "django",
}
#: The root's modules, each in its tier: the errors are pure (their module path is in
#: every stored failure: Celery records ``exc_module``); the foundation every tier stands
#: on; the public surface; the Django app under Django's own names.
ROOT = {
    "errors": "pure",
    "clock": "foundation",
    "conf": "foundation",
    "signals": "foundation",
    "__init__": "public",
    "task": "public",
    "install": "public",
    "beat": "public",
    "testing": "public",
    "pytest_plugin": "public",
    "apps": "django",
    "checks": "django",
    "models": "django",
    "middleware": "django",
}
#: What each tier may import of the package's tiers (its own included).
MAY_USE = {
    "pure": {"pure"},
    "foundation": {"pure", "foundation"},
    "ledger": {"pure", "foundation", "ledger"},
    "celery": {"pure", "foundation", "celery", "ledger"},
    "contrib": {"pure", "foundation", "celery", "ledger", "contrib", "public"},
    "public": {"pure", "foundation", "celery", "ledger", "contrib", "public"},
    "django": {"pure", "foundation", "celery", "ledger", "contrib", "public", "django"},
}
#: What the Celery tier may import of the ledger at import time (is it on? the crash
#: points), and its doors, opened inside functions only.
LEDGER_AT_IMPORT = frozenset({"ledger", "ledger._crashpoints"})
LEDGER_DOORS = frozenset({"ledger.api", "ledger.operations"})
#: Calls that read the time; only ``clock`` (and the inert crash points) may make them.
CLOCK_READS = frozenset(
    {
        ("datetime", "now"),
        ("datetime", "utcnow"),
        ("datetime", "today"),
        ("date", "today"),
        ("time", "time"),
        ("time", "monotonic"),
        ("time", "perf_counter"),
        ("time", "time_ns"),
        ("time", "monotonic_ns"),
    }
)
MAY_READ_THE_CLOCK = frozenset({"clock", "ledger._crashpoints"})


@dataclass(frozen=True)
class Import:
    module: str  # importing module, relative to the package ("ledger.api")
    target: str  # absolute module name imported
    lazy: bool  # inside a function


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def tier_of(module: str) -> str | None:
    """The tier of ``module`` (relative to the package), from where it lives; ``None``
    for a root module no tier names."""
    head = module.split(".")[0]
    if "." in module or head in FOLDERS:
        return FOLDERS.get(head)
    return ROOT.get(module)


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        yield module_name(path), ast.parse(path.read_text(), str(path))


def type_checking_nodes(tree: ast.Module) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(child) for child in ast.walk(node))
    return hidden


def imports_of(module: str, tree: ast.Module) -> list[Import]:
    hidden = type_checking_nodes(tree)
    lazy_nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lazy_nodes.update(id(child) for child in ast.walk(node))
    is_package = (
        PACKAGE / module.replace(".", "/") / "__init__.py"
    ).exists() or module == "__init__"
    found = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        lazy = id(node) in lazy_nodes
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, lazy) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                own = ["celery_deadlines", *([] if module == "__init__" else module.split("."))]
                anchor = own if is_package else own[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
                names = [f"{base}.{alias.name}" for alias in node.names]
                if node.module:
                    names.append(base)
            found += [Import(module, name, lazy) for name in names]
    return found


def ours(target: str) -> str | None:
    """The package module ``target`` names (relative), or None for anything else."""
    if not target.startswith("celery_deadlines"):
        return None
    relative = target.removeprefix("celery_deadlines").lstrip(".")
    if not relative:
        return "__init__"
    parts = relative.split(".")
    while parts:
        candidate = PACKAGE.joinpath(*parts)
        if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
            return ".".join(parts)
        parts.pop()  # a name imported from a module, not a module
    return None


def violations(module: str, imported: Import) -> list[str]:
    tier = tier_of(module)
    target = ours(imported.target)
    foreign = imported.target.split(".")[0]
    where = f"{module} imports {imported.target}" + (" (in a function)" if imported.lazy else "")
    problems = []
    if tier is None:
        return [f"{module} is in no tier: a folder's, or one of ROOT's (test_architecture)"]
    if tier in {"pure", "foundation"} and foreign in {"kombu", "billiard", "django"}:
        kind = "a pure rule" if tier == "pure" else "a foundation module"
        problems.append(f"{where}: {kind} imports {foreign}")
    if tier == "pure" and foreign == "celery":
        problems.append(f"{where}: a pure rule imports celery")
    django_at_import = foreign == "django" and not imported.lazy and module != "testing"
    if tier in {"celery", "public"} and django_at_import:
        problems.append(f"{where}: the {tier} tier imports Django at import time")
    if target is None:
        return problems
    target_tier = tier_of(target)
    if target_tier not in MAY_USE[tier]:
        problems.append(f"{where}: the {tier} tier reaches the {target_tier} tier")
    elif tier == "celery" and target_tier == "ledger":
        if target in LEDGER_DOORS:
            if not imported.lazy:
                problems.append(f"{where}: the ledger's doors are opened inside functions")
        elif target not in LEDGER_AT_IMPORT:
            problems.append(
                f"{where}: the Celery tier may use only {sorted(LEDGER_AT_IMPORT | LEDGER_DOORS)}"
            )
    elif tier == "contrib" and target_tier == "public" and target != "beat":
        problems.append(f"{where}: an integration builds on the Celery tier and beat alone")
    return problems


def clock_reads(module: str, tree: ast.Module) -> list[str]:
    if module in MAY_READ_THE_CLOCK:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if (name, node.func.attr) in CLOCK_READS:
            found.append(f"{module}:{node.lineno} reads the time ({ast.unparse(node.func)})")
        if tier_of(module) == "pure" and ast.unparse(node.func).startswith("get_clock"):
            found.append(f"{module}:{node.lineno}: a pure rule reads the clock")
    if tier_of(module) == "pure" and "get_clock" in ast.unparse(tree):
        found.append(f"{module}: a pure rule asks for the clock (get_clock)")
    return found


def test_every_module_keeps_to_its_tier() -> None:
    problems = [
        problem
        for module, tree in modules()
        for imported in imports_of(module, tree)
        for problem in violations(module, imported)
    ]
    assert problems == []


def test_only_the_clock_module_reads_the_time() -> None:
    problems = [problem for module, tree in modules() for problem in clock_reads(module, tree)]
    assert problems == []


def test_every_module_of_the_package_lives_in_a_tier() -> None:
    assert [module for module, _ in modules() if tier_of(module) is None] == []


def test_the_pure_rules_are_the_rules_package_and_the_errors() -> None:
    pure = sorted(module for module, _ in modules() if tier_of(module) == "pure")
    assert "errors" in pure
    assert all(module == "errors" or module.startswith("rules") for module in pure)
    assert {"rules.wire", "rules.gates", "rules.records"} <= set(pure)


@pytest.mark.parametrize(
    ("module", "source", "complaint"),
    [
        ("rules.gates", "from django.db import connections", "a pure rule imports django"),
        ("rules.gates", "from celery import Task", "a pure rule imports celery"),
        (
            "rules.outcomes",
            "def f():\n    from ..clock import get_clock",
            "the pure tier reaches the foundation tier",
        ),
        ("rules.budgets", "import datetime\nx = datetime.datetime.now()", "reads the time"),
        ("rules.records", "from ..ledger.sql.rows import Unclaimed", "reaches the ledger"),
        ("rules.skew", "from ..clock import get_clock\nget_clock()", "asks for the clock"),
        ("task", "from django.db import connections", "Django at import time"),
        ("core.request", "from ..ledger.sql.runs import Runs", "may use only"),
        ("core.claiming", "from ..ledger.api import store_for", "opened inside functions"),
        ("core.request", "from ..task import DeadlineTask", "reaches the public tier"),
        ("core.effects", "from ..contrib import opentelemetry", "reaches the contrib tier"),
        ("ledger.api", "def f():\n    from ..task import DeadlineTask", "reaches the public"),
        ("ledger.api", "def f():\n    from ..core import options", "reaches the celery tier"),
        ("ledger.sql.runs", "from ...admin import RunAdmin", "reaches the django tier"),
        ("contrib.httpx", "from ..install import install", "Celery tier and beat alone"),
        ("signals", "from .core import refusals", "the foundation tier reaches the celery"),
        ("celery_extra", "from .errors import DeadlineError", "is in no tier"),
    ],
)
def test_the_tier_test_fails_when_a_module_breaks_its_tier(
    module: str, source: str, complaint: str
) -> None:
    tree = ast.parse(source)
    problems = [p for i in imports_of(module, tree) for p in violations(module, i)]
    problems += clock_reads(module, tree)
    assert any(complaint in problem for problem in problems), problems
