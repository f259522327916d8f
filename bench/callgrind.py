"""Instructions counted by valgrind's callgrind: the two instruction benchmarks' runner."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def collected(loop: str, *args: str, toggle: str | None = None) -> int:
    """Instructions a fresh interpreter executes running ``loop`` (``python -c``) with
    ``args``: all of them, or with ``toggle`` only those inside that C function
    (``functools_reduce``). The hash seed is fixed, so runs repeat."""
    collect = ["--collect-atstart=no", f"--toggle-collect={toggle}"] if toggle else []
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            *collect,
            sys.executable,
            "-c",
            loop,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    match = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or match is None:
        raise SystemExit(f"the loop failed under callgrind:\n{out.stderr[-3000:]}")
    return int(match.group(1))
