"""Instructions counted by valgrind's callgrind: the two instruction benchmarks' runner."""

from __future__ import annotations

import os
import re
import subprocess
import sys

#: ``BENCH_SMOKE=1`` (make bench-smoke): the same code runs without valgrind, each count
#: is 1 (no figure judged): what is checked is that the benchmark still runs.
SMOKE = os.environ.get("BENCH_SMOKE") == "1"


def valgrind(*options: str) -> list[str]:
    """The command prefix that runs a program under callgrind (none at the smoke size)."""
    if SMOKE:
        return []
    return ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *options]


def collected(loop: str, *args: str, toggle: str | None = None) -> int:
    """Instructions a fresh interpreter executes running ``loop`` (``python -c``) with
    ``args``: all of them, or with ``toggle`` only those inside that C function
    (``functools_reduce``). The hash seed is fixed, so runs repeat."""
    collect = ["--collect-atstart=no", f"--toggle-collect={toggle}"] if toggle else []
    out = subprocess.run(
        [*valgrind(*collect), sys.executable, "-c", loop, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    if SMOKE:
        if out.returncode != 0:
            raise SystemExit(f"the loop failed:\n{out.stderr[-3000:]}")
        return 1
    match = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or match is None:
        raise SystemExit(f"the loop failed under callgrind:\n{out.stderr[-3000:]}")
    return int(match.group(1))
