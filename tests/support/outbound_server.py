"""``python -m tests.support.outbound_server``: the service the outbound tests call, a
real Django server process (Django's threaded WSGI server, as ``runserver`` runs it) on
a port the system picks, printed as ``serving on PORT`` once it listens.

Its settings are tests/support/outbound_settings.py; the broker, result backend and
queue its views publish to come from the environment (``TEST_BROKER_URL``,
``TEST_RESULT_BACKEND``, ``TEST_QUEUE``).
"""

from __future__ import annotations

import os


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
