"""A payment provider for the demo, flaky in the worst way: it takes the charge, then the
reply is lost (a timeout the caller cannot tell from "never arrived").

Charges are kept in ``provider.jsonl`` under the demo's var directory, one line per
charge, so the demo (and its tests) can count them; ``lookup`` is the provider's
"retrieve by idempotency key", what a reconciler asks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.conf import settings


class ProviderTimeout(Exception):
    """The provider did not answer in time: the charge may or may not have happened."""


def _ledger() -> Path:
    return Path(settings.VAR_DIR) / "provider.jsonl"


def charges(key: str | None = None) -> list[dict[str, Any]]:
    path = _ledger()
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [c for c in found if key is None or c["key"] == key]


def charge(key: str, amount_cents: int) -> dict[str, Any]:
    """Charge once per call (not idempotent); the first call of a key loses its reply."""
    first = not charges(key)
    entry = {"id": f"ch_{len(charges()) + 1}", "key": key, "amount_cents": amount_cents}
    fd = os.open(_ledger(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)
    if first:
        raise ProviderTimeout(f"no reply within 2 s for {key}")
    return entry


def lookup(key: str) -> dict[str, Any] | None:
    found = charges(key)
    return found[-1] if found else None
