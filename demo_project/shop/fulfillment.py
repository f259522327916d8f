"""The fulfillment service of the address-change story, as a JSON file.

It holds what a worker must read again before acting: each order's state and whether
the customer confirmed the change; and whether the service answers at all. The demo
changes it between attempts, the way the world changes while a worker is down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings


class FulfillmentUnavailable(Exception):
    """The fulfillment service did not answer (transient: the run will come back)."""


def _path() -> Path:
    return Path(settings.VAR_DIR) / "fulfillment.json"


def _read() -> dict[str, Any]:
    path = _path()
    return json.loads(path.read_text()) if path.exists() else {"available": True, "orders": {}}


def _write(state: dict[str, Any]) -> None:
    _path().write_text(json.dumps(state, indent=2))


def reset(order_id: int, *, available: bool) -> None:
    """An open order whose customer confirmed the address change."""
    _write({
        "available": available,
        "orders": {str(order_id): {"order_state": "open", "customer_confirmation": "confirmed",
                                   "address": "Alte Str. 1, Berlin"}},
    })  # fmt: skip


def move_to_warehouse(order_id: int) -> None:
    """The order is picked: it moves to the locked warehouse queue (and the service is
    back)."""
    state = _read()
    state["available"] = True
    state["orders"][str(order_id)]["order_state"] = "locked_for_warehouse"
    _write(state)


def facts(order_id: int) -> dict[str, Any]:
    """What the plan's assumptions are checked against: read now, never cached."""
    order = _read()["orders"][str(order_id)]
    return {key: order[key] for key in ("order_state", "customer_confirmation")}


def update_address(order_id: int, address: str) -> dict[str, Any]:
    state = _read()
    if not state["available"]:
        raise FulfillmentUnavailable("fulfillment service unavailable")
    state["orders"][str(order_id)]["address"] = address
    _write(state)
    return {"order": order_id, "address": address}


def address_of(order_id: int) -> str:
    return str(_read()["orders"][str(order_id)]["address"])
