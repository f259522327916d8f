"""Django settings of the service the outbound tests call (tests/support/outbound_server.py):
DeadlineMiddleware, trusting the worker's address (loopback) and honouring the headers
the library sends by default, named as the how-to names them. No database: the service
only publishes."""

from __future__ import annotations

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
USE_TZ = True
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
ROOT_URLCONF = "tests.support.outbound_urls"
MIDDLEWARE = ["celery_deadlines.middleware.DeadlineMiddleware"]

# the receiving side of the how-to "Carry the deadline to the services you call"
CELERY_DEADLINES_TRUSTED_PROXIES = ["127.0.0.1"]  # the calling worker's address
CELERY_DEADLINES_REQUEST_HEADERS = {
    "grpc-timeout": "grpc-timeout",
    "X-Request-Timeout-Ms": "milliseconds",
    "X-Request-Deadline": "rfc3339",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"celery_deadlines": {"handlers": ["stderr"], "level": "INFO"}},
}
