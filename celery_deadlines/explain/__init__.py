"""``explain``: the operator checklist of docs/explanation/run-ledger.md, answered for one run.

Which worker owns this run now? When does that lease expire, in UTC? Which version did
it claim? What was the last durable checkpoint? Can an old worker still pass the guard?
How long is left, or when did it end? What moves it next? Every answer comes from the
ledger (the run row, its event history, effects, plans and child runs) and one reading
of the database clock.

The answers are built once, as plain JSON values (:func:`explanation_of`, :func:`facts`:
the :class:`~.shape.Explanation`); ``manage.py deadlines explain TASK_ID --json`` prints
them and :func:`render_text` makes the text from them alone.
"""

from __future__ import annotations

import json

from .facts import LONGEST_ID, explanation_of, facts, task_ids_named, typed_id
from .shape import Explanation, utc
from .text import render_text

__all__ = [
    "LONGEST_ID",
    "Explanation",
    "explanation_of",
    "facts",
    "render_text",
    "task_ids_named",
    "to_json",
    "typed_id",
    "utc",
]


def to_json(explanation: Explanation) -> str:
    """The explanation as a JSON document."""
    return json.dumps(explanation, indent=2)
