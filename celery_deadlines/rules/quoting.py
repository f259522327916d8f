"""How a value that came from outside is repeated in an error, a log line or a result.

Headers, stored rows and settings may be written by anyone: an error that quotes one
must stay short (a 10 MB header must not become a 10 MB log line and stored result) and
must not carry control characters to a terminal. :func:`shown` is the one way to quote.
"""

from __future__ import annotations

import reprlib
from functools import cache
from typing import Final

#: The most characters of a value a message repeats (the rest is cut as ``...``).
LIMIT: Final = 80


def shown(value: object, limit: int = LIMIT) -> str:
    """``value``'s ``repr``, at most ``limit`` characters and ``...`` (a longer one is
    cut); control and invisible characters are escaped, as ``repr`` does."""
    if isinstance(value, (str, bytes)):  # the start of a string says the most
        text = repr(value[:limit])
        cut = len(value) > limit
    else:
        try:
            text = _repr(limit).repr(value)
        except Exception:  # noqa: BLE001 (a hostile __repr__ must not break the message)
            text = f"<{type(value).__name__}>"
        cut = False
    if len(text) > limit:  # escapes make a repr longer than its value
        return text[:limit] + "..."
    return text + "..." if cut else text


def named(name: str, limit: int = LIMIT) -> str:
    """A name or an id (a setting's, a header's, a task id) as a message repeats it: as
    written, unless it is longer than ``limit`` or holds a character a terminal acts on
    (then as :func:`shown` quotes it)."""
    return name if len(name) <= limit and name.isprintable() else shown(name, limit)


@cache
def _repr(limit: int) -> reprlib.Repr:
    """A ``repr`` that stops early in large containers (Python 3.11's takes no keywords)."""
    bounded = reprlib.Repr()
    bounded.maxlevel = 2
    bounded.maxtuple = bounded.maxlist = bounded.maxarray = bounded.maxdict = 4
    bounded.maxset = bounded.maxfrozenset = bounded.maxdeque = 4
    bounded.maxstring = bounded.maxlong = bounded.maxother = limit
    return bounded
