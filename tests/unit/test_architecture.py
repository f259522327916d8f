"""The package's tiers, held: what each module may import and who may read the clock.

Walks every module of the package (migrations aside) with ``ast``, counting every
import, function-local ones too (a lazy import hides a dependency, it does not remove
it); imports under ``if TYPE_CHECKING:`` are for the type checker only and are not
counted. A module's tier is where it lives: ``rules/`` (and ``errors``) the pure
rules, ``ledger/`` the ledger, Django's own names the Django surface, the rest of the
package root the Celery tier. DEVELOPERS.md, "The tiers", is the map: what each tier
may import.

Only ``clock`` reads the time (the crash points, inert test hooks, aside).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_deadlines"

#: The pure tier's package, and the one root module every tier shares (the errors'
#: module path is in every stored failure: Celery records ``exc_module``).
RULES = "rules"
SHARED_PURE = frozenset({"errors"})
#: The Django surface: Django's own module names at the root, and its folders.
DJANGO = frozenset({"apps", "checks", "admin", "explain", "models", "management", "middleware"})
#: What the ledger may use of the Celery tier (below it, or beside it).
LEDGER_MAY_USE = frozenset({"clock", "conf", "signals", "_crashpoints"})
#: The ledger's doors, for the Celery tier (inside functions only).
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
MAY_READ_THE_CLOCK = frozenset({"clock", "_crashpoints"})


@dataclass(frozen=True)
class Import:
    module: str  # importing module, relative to the package ("ledger.api")
    target: str  # absolute module name imported
    lazy: bool  # inside a function


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def tier_of(module: str) -> str:
    """The tier of ``module`` (relative to the package), from where it lives."""
    head = module.split(".")[0]
    if head == "ledger":
        return "ledger"
    if head == RULES or head in SHARED_PURE:
        return "pure"
    if head in DJANGO:
        return "django"
    return "celery"  # the package root


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
    if tier == "pure":
        if foreign in {"celery", "kombu", "billiard", "django"}:
            problems.append(f"{where}: a pure rule imports {foreign}")
        if target is not None and tier_of(target) != "pure":
            problems.append(f"{where}: a pure rule imports the {tier_of(target)} tier")
    elif tier == "celery":
        if foreign == "django" and not imported.lazy and module != "testing":
            problems.append(f"{where}: the Celery tier imports Django at import time")
        if target is not None and tier_of(target) == "django":
            problems.append(f"{where}: the Celery tier imports the Django surface")
        if target is not None and tier_of(target) == "ledger" and target != "ledger":
            if target not in LEDGER_DOORS:
                problems.append(f"{where}: the Celery tier may use only {sorted(LEDGER_DOORS)}")
            elif not imported.lazy:
                problems.append(f"{where}: the ledger's doors are opened inside functions")
    elif tier == "ledger" and target is not None:
        target_tier = tier_of(target)
        if target_tier == "django" or (target_tier == "celery" and target not in LEDGER_MAY_USE):
            problems.append(f"{where}: the ledger reaches back up into the {target_tier} tier")
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
            "a pure rule imports the celery",
        ),
        ("rules.budgets", "import datetime\nx = datetime.datetime.now()", "reads the time"),
        ("rules.records", "from ..ledger.sql.rows import Unclaimed", "imports the ledger"),
        ("rules.skew", "from ..clock import get_clock\nget_clock()", "asks for the clock"),
        ("task", "from django.db import connections", "Django at import time"),
        ("task", "from .ledger.sql.runs import Runs", "may use only"),
        ("task", "from .ledger.api import store_for", "opened inside functions"),
        ("ledger.api", "def f():\n    from ..task import DeadlineTask", "reaches back up"),
        ("ledger.sql.runs", "from ...admin import RunAdmin", "reaches back up into the django"),
    ],
)
def test_the_tier_test_fails_when_a_module_breaks_its_tier(
    module: str, source: str, complaint: str
) -> None:
    tree = ast.parse(source)
    problems = [p for i in imports_of(module, tree) for p in violations(module, i)]
    problems += clock_reads(module, tree)
    assert any(complaint in problem for problem in problems), problems
