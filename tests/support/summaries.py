"""Lines a test module leaves for the end of the run's terminal summary (a line written
during the tests is captured with them): the fuzz tier's counts."""

from __future__ import annotations

import pytest

#: One line per module that ran, printed by ``pytest_terminal_summary`` (tests/conftest.py).
LINES = pytest.StashKey[list[str]]()


def leave(config: pytest.Config, line: str) -> None:
    """Print ``line`` after the tests (in this process: with ``-n 0``, as ``make fuzz``)."""
    config.stash.setdefault(LINES, []).append(line)
