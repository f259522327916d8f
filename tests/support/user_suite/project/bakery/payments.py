"""The payment provider, as the bakery's tests stand it in: what it charged, and a
refusal to connect it can be told to make."""

#: every charge made: (order, amount)
CHARGES: list[tuple[str, int]] = []
#: orders whose next charge cannot connect (the request never leaves)
UNREACHABLE: set[str] = set()


def charge(order: str, amount: int) -> str:
    if order in UNREACHABLE:
        UNREACHABLE.discard(order)
        raise ConnectionRefusedError(f"the provider is unreachable for {order}")
    CHARGES.append((order, amount))
    return f"receipt-{order}"
