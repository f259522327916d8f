"""Deadlines on OpenTelemetry spans (the ``otel`` extra); without it, every call does nothing.

The contract, for the rest of the package: these functions never raise and never import
OpenTelemetry unless it is installed. Issue 16 item 3 fills them in.
"""

from __future__ import annotations

from datetime import datetime, timedelta


def annotate_ingress(*, deadline: datetime, source: str, remaining: timedelta) -> None:
    """Set the request's deadline, its source and the time left on the current span."""
