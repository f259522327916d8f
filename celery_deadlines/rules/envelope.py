"""Whether a DeadlineTask's message can be judged at all: its envelope, field by field.

A worker reads a task message's headers and the shape of its body in its main process
(Celery's request, its revocation and ETA checks, the claim gate, the time-limit cap, a
refusal's stored result) and in the pool process (the ledger's claim, the run row
rebuilt from the request, the retry gate). Celery assumes the types it writes: an id of
another type stopped the worker when a refusal stored its result, a ``timelimit`` of
strings stopped it when the cap compared them, a ``retries`` of another type failed the
ledger's claim with a raw error. This module is the one rule of what each field must be;
a message that breaks it is refused with ``invalid_message``
(``celery_deadlines.core.request``).

=====================  =================================================================
field                  well-formed
=====================  =================================================================
``id``                 a string of 1 to :data:`LONGEST_ID` characters
``shadow``, ``group``  absent, ``None`` or a string
``parent_id``,         absent, ``None`` or a string of at most :data:`LONGEST_ID`
``root_id``            characters (the ledger's columns)
``retries``            absent, ``None`` or an integer from 0 to :data:`MOST_RETRIES`
``timelimit``          absent, ``None`` or a pair of ``None`` or finite seconds >= 0
``eta``, ``expires``   absent, ``None``, a non-empty string (ISO 8601, which Celery
                       parses) or a datetime (kombu's JSON decodes one)
``group_index``        absent, ``None`` or an integer >= 0
``stamped_headers``    absent, ``None`` or a list of strings
``stamps``             absent, ``None`` or a mapping
the body               ``(args, kwargs, embed)``: a list, a mapping, and ``None`` or a
                       mapping whose ``callbacks``, ``errbacks`` and ``chain`` are
                       ``None`` or lists of signatures (mappings), its ``chord`` ``None``
                       or a signature
=====================  =================================================================

Where it is held, at the least cost to a message that keeps it: the fields this package
reads of every message when the worker hands it to the pool (:func:`fits`: the id, the
name, ``retries``), and the ``timelimit`` as Celery's request takes it
(:func:`is_duration`); any other field when Celery's own reading of it fails in the
worker's main process (:func:`flaw` names the field; an error it does not explain is
Celery's to handle). A malformed ``root_id`` or ``parent_id`` is not a link the ledger
keeps (:func:`link`). What the deadline headers say is the claim gate's (an unreadable
``x_deadline`` is ``invalid_deadline``), and what an ``eta`` or ``expires`` string says
is Celery's parse.
Pure: no clock, no Celery.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from .quoting import shown

#: The longest id a message may carry: Celery's ids are 36 characters; the run ledger's
#: columns (and django-celery-results') hold 255.
LONGEST_ID: Final = 255
#: The largest ``retries``: the ledger's column is a 32-bit integer.
MOST_RETRIES: Final = 2**31 - 1

_INFINITY: Final = float("inf")
#: The links (``None`` or a string of at most :data:`LONGEST_ID` characters).
_LINKS: Final = ("parent_id", "root_id")
#: The instants Celery parses (``None``, an ISO 8601 string, or a datetime).
_INSTANTS: Final = ("eta", "expires")
#: The embed's fields that hold lists of signatures.
_SIGNATURE_LISTS: Final = ("callbacks", "errbacks", "chain")


def fits(task_id: object, name: object, retries: object) -> bool:
    """Whether the fields this package reads of every message are well-formed: its id,
    its name (``shadow``, or the task's) and ``retries``, as Celery's request holds
    them (``False``: :func:`flaw` names the field). Every message is asked this, when
    the worker hands it to the pool (``DeadlineRequest.revoked``, inline)."""
    return (
        type(task_id) is str
        and 0 < len(task_id) <= LONGEST_ID
        and type(name) is str
        and (retries is None or (type(retries) is int and 0 <= retries <= MOST_RETRIES))
    )


def link(value: object) -> str | None:
    """A ``root_id`` or ``parent_id`` the run ledger keeps: a string of at most
    :data:`LONGEST_ID` characters, else ``None``."""
    if type(value) is str and len(value) <= LONGEST_ID:
        return value
    return None


def is_duration(value: object) -> bool:
    """A time limit as Celery reads one: ``None`` (none) or finite seconds >= 0."""
    return value is None or (type(value) in (int, float) and 0 <= value < _INFINITY)  # type: ignore[operator]


def task_id(headers: Mapping[str, Any]) -> str | None:
    """The message's id when it can name a stored result (a string of 1 to
    :data:`LONGEST_ID` characters), else ``None``."""
    value = headers.get("id")
    if type(value) is str and 0 < len(value) <= LONGEST_ID:
        return value
    return None


def retries(headers: Mapping[str, Any]) -> int | None:
    """The message's attempt number (absent or ``None``: 0), ``None`` when it is not an
    integer from 0 to :data:`MOST_RETRIES`."""
    value = headers.get("retries")
    if value is None:
        return 0
    if type(value) is int and 0 <= value <= MOST_RETRIES:
        return value
    return None


def flaw(headers: Mapping[str, Any], body: object) -> str | None:
    """What makes the message ``headers`` and ``body`` (decoded) unfit to be judged: its
    first malformed field, named, with its value cut by :func:`shown`; ``None`` when
    each field is as the table above says."""
    if task_id(headers) is None:
        return _wrong(headers, "id", f"a string of 1 to {LONGEST_ID} characters")
    get = headers.get
    for name in ("shadow", "group"):
        value = get(name)
        if value is not None and type(value) is not str:
            return _wrong(headers, name, "None or a string")
    for name in _LINKS:
        value = get(name)
        if value is not None and not (type(value) is str and len(value) <= LONGEST_ID):
            return _wrong(headers, name, f"None or a string of at most {LONGEST_ID} characters")
    if retries(headers) is None:
        return _wrong(headers, "retries", f"an integer from 0 to {MOST_RETRIES}")
    limits = get("timelimit")
    if limits is not None and not (
        type(limits) in (list, tuple)
        and len(limits) == 2
        and is_duration(limits[0])
        and is_duration(limits[1])
    ):
        return _wrong(headers, "timelimit", "a pair of None or finite seconds >= 0")
    for name in _INSTANTS:
        value = get(name)
        if value is not None and not (
            (type(value) is str and value) or isinstance(value, datetime)
        ):
            return _wrong(headers, name, "None, an ISO 8601 string or a datetime")
    index = get("group_index")
    if index is not None and not (type(index) is int and index >= 0):
        return _wrong(headers, "group_index", "None or an integer >= 0")
    stamped = get("stamped_headers")
    if stamped is not None and not (
        type(stamped) in (list, tuple) and all(type(name) is str for name in stamped)
    ):
        return _wrong(headers, "stamped_headers", "None or a list of strings")
    stamps = get("stamps")
    if stamps is not None and not isinstance(stamps, Mapping):
        return _wrong(headers, "stamps", "None or a mapping")
    return _body_flaw(body)


def _body_flaw(body: object) -> str | None:
    """What makes ``body`` other than Celery's ``(args, kwargs, embed)``, or ``None``."""
    if not (isinstance(body, (list, tuple)) and len(body) == 3):
        return f"its body {shown(body)} is not Celery's (args, kwargs, embed)"
    args: object = body[0]
    kwargs: object = body[1]
    embed: object = body[2]
    if type(args) not in (list, tuple):
        return f"its args {shown(args)} are not a list"
    if not isinstance(kwargs, Mapping):
        return f"its kwargs {shown(kwargs)} are not a mapping"
    if embed is None:
        return None
    if not isinstance(embed, Mapping):
        return f"its body's embed {shown(embed)} is not a mapping"
    for name in _SIGNATURE_LISTS:
        signatures = embed.get(name)
        if signatures is not None and not (
            type(signatures) in (list, tuple)
            and all(isinstance(signature, Mapping) for signature in signatures)
        ):
            return f"its {name} {shown(signatures)} are not a list of signatures"
    chord = embed.get("chord")
    if chord is not None and not isinstance(chord, Mapping):
        return f"its chord {shown(chord)} is not a signature"
    return None


def _wrong(headers: Mapping[str, Any], name: str, expected: str) -> str:
    if name not in headers:
        return f"it has no {name}, which must be {expected}"
    return f"its {name} {shown(headers[name])} is not {expected}"
