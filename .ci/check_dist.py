"""Check what `make dist` built: the wheel is the package and its licence, nothing else;
the sdist is the package, its licence, its docs and its tests (with what they import).

Usage: python .ci/check_dist.py dist
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

PACKAGE = "celery_deadlines"
#: What the package needs at run time besides its modules.
PACKAGE_DATA = (
    f"{PACKAGE}/py.typed",
    f"{PACKAGE}/migrations/0001_initial.py",
    f"{PACKAGE}/ledger/sql/runs.sql",  # the statements, read at import
)
#: What the tests import or read, and what makes the sdist a source release.
SDIST_MUST_HAVE = (
    "PKG-INFO",
    "pyproject.toml",
    "LICENSE",
    "README.md",
    "CHANGELOG.md",
    "docs/reference/settings.md",
    "docs/conf.py",
    "tests/conftest.py",
    "tests/settings.py",
    "tests/support/__init__.py",
    "tests/repository/test_packaging.py",
    "tests/integration/ledger/test_crash_sweep.py",
    "demo_project/settings.py",
    "compat/celery_compat.py",
    "manage.py",
)


def only(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    if len(found) != 1:
        sys.exit(f"expected one {pattern} in {dist}, found {[p.name for p in found]}")
    return found[0]


def check(dist: Path) -> list[str]:
    wheel_path, sdist_path = only(dist, "*.whl"), only(dist, "*.tar.gz")
    with zipfile.ZipFile(wheel_path) as wheel:
        in_wheel = set(wheel.namelist())
    with tarfile.open(sdist_path) as sdist:
        members = [m.name for m in sdist.getmembers() if m.isfile()]
    root = PurePosixPath(members[0]).parts[0]
    in_sdist = {str(PurePosixPath(name).relative_to(root)) for name in members}

    problems = []
    dist_info = {name.split("/")[0] for name in in_wheel if ".dist-info/" in name}
    if len(dist_info) != 1 or f"{dist_info.pop()}/licenses/LICENSE" not in in_wheel:
        problems.append("the wheel has no .dist-info/licenses/LICENSE")
    strays = sorted(
        name for name in in_wheel if not name.startswith((f"{PACKAGE}/", f"{root}.dist-info/"))
    )
    problems += [f"the wheel carries {name}" for name in strays]  # tests/, demo_project/, ...
    problems += [f"the wheel lacks {name}" for name in PACKAGE_DATA if name not in in_wheel]
    problems += [f"the sdist lacks {name}" for name in SDIST_MUST_HAVE if name not in in_sdist]
    problems += [
        f"the {kind} carries {name}"
        for kind, names in (("wheel", in_wheel), ("sdist", in_sdist))
        for name in sorted(names)
        if "__pycache__" in name or name.endswith(".pyc")
    ]
    package_in_sdist = {name for name in in_sdist if name.startswith(f"{PACKAGE}/")}
    package_in_wheel = {name for name in in_wheel if name.startswith(f"{PACKAGE}/")}
    if package_in_sdist != package_in_wheel:
        problems.append(
            f"the wheel's package differs from the sdist's: "
            f"{sorted(package_in_sdist ^ package_in_wheel)}"
        )
    print(
        f"{wheel_path.name}: {len(in_wheel)} files ({len(package_in_wheel)} in {PACKAGE}/)\n"
        f"{sdist_path.name}: {len(in_sdist)} files "
        f"({sum(name.startswith('tests/') for name in in_sdist)} in tests/)"
    )
    return problems


if __name__ == "__main__":
    problems = check(Path(sys.argv[1] if len(sys.argv) > 1 else "dist"))
    for problem in problems:
        print(problem, file=sys.stderr)
    sys.exit(1 if problems else 0)
