"""``python -m tests.support.outbound_server``: the service the outbound tests call, a
real Django server process (Django's threaded WSGI server, as ``runserver`` runs it) on
a port the system picks, printed as ``serving on PORT`` once it listens.

Its settings are tests/support/outbound_settings.py; the broker, result backend and
queue its views publish to come from the environment (``TEST_BROKER_URL``,
``TEST_RESULT_BACKEND``, ``TEST_QUEUE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import REPO, read_log


@contextmanager
def serving(env: Mapping[str, str], log_path: Path) -> Iterator[str]:
    """The service in a process of its own (its stderr in ``log_path``), with ``env``
    added to this process's environment: its base URL, until the block ends."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.outbound_server"],
            cwd=REPO,
            env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "tests.support.outbound_settings"},
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
    assert process.stdout is not None
    try:
        ready = process.stdout.readline()
        assert ready.startswith("serving on "), read_log(log_path)
        yield f"http://127.0.0.1:{ready.split()[-1]}"
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.outbound_settings")
    import django

    django.setup()
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    server = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler)
    server.set_app(get_wsgi_application())
    print(f"serving on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
