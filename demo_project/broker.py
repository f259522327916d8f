"""kombu's filesystem transport, with every message written whole before a consumer can
see it: the embedded default's broker (``CELERY_BROKER_TRANSPORT``, beside
``CELERY_BROKER_URL = "filesystem://"``).

kombu's own ``_put`` creates the message file under its final name and then writes it;
a worker polling the folder can move and read it in between, find it empty, and stop
with ``Unrecoverable error: JSONDecodeError`` (kombu#1551; seen here when a task fanned
out a dozen children while the worker polled). Here the message is written under a
name the consumer does not read (``.partial`` for ``.msg``) and renamed into place,
which POSIX makes atomic: a consumer sees the whole file or none.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    # kombu's own signature (its stubs disagree with the virtual base's)
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # kombu's name (its consumer sorts by it: the millisecond comes first)
        stem = os.path.join(self.data_folder_out, f"{round(monotonic() * 1000)}_{uuid.uuid4()}")
        final = f"{stem}.{queue}.msg"
        # no ".<queue>.msg" in it: kombu 5.5's consumer takes any name containing that
        partial = f"{stem}.{queue}.partial"
        try:
            with open(partial, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel


#: The ``broker_transport`` setting that selects it (``CELERY_BROKER_TRANSPORT``).
TRANSPORT = "demo_project.broker:Transport"
