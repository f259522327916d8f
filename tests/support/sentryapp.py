"""The worker app of the Sentry tests: the app of the module ``TEST_SENTRY_APP`` names
(``tests.support.workerapp``, or ``tests.support.sentry_tasks`` for the ledger), reported
to Sentry by sentry-sdk's Celery and logging integrations, as an application would set
them up, through a transport that sends nothing anywhere: it appends every event and
transaction to ``TEST_SENTRY_FILE``, one JSON line each.

``sentry_sdk.init`` runs at import, in the worker's main process (the claim gate and
the reconciler report from there), before the pool processes are forked, which inherit
the client. The transport writes synchronously (no background thread to lose across the
fork), each line with one ``write(2)`` on a file opened ``O_APPEND``, so lines of the
main process and of every pool process never interleave.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.transport import Transport

#: The envelope items a test reads: errors (and log records at ERROR) and transactions.
RECORDED = frozenset({"event", "transaction"})


class JsonLinesTransport(Transport):
    """Appends each event and transaction to ``path`` as ``{"type", "pid", "payload"}``."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type not in RECORDED:
                continue
            payload: Any = json.loads(item.payload.get_bytes())
            line = json.dumps({"type": item.type, "pid": os.getpid(), "payload": payload})
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)


app: Any = importlib.import_module(os.environ["TEST_SENTRY_APP"]).app

sentry_sdk.init(
    transport=JsonLinesTransport(Path(os.environ["TEST_SENTRY_FILE"])),
    integrations=[
        CeleryIntegration(),
        LoggingIntegration(level=logging.INFO, event_level=logging.ERROR),
    ],
    auto_enabling_integrations=False,  # Celery and logging, nothing found by chance
    traces_sample_rate=1.0,
)

__all__ = ["app"]
