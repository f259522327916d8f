"""A worker's metrics exporter: ``deadlines_metrics_port`` read through Celery's
configuration, acted on at ``worker_ready`` (the real worker:
tests/integration/contrib/test_prometheus_worker.py)."""

from __future__ import annotations

import ipaddress
import logging

import pytest
from celery import Celery
from celery.signals import worker_ready

from celery_deadlines import ConfigurationError, install
from celery_deadlines.conf import METRICS_PORT, settings_for


@pytest.mark.parametrize("port", [None, 1, 9808, 65535])
def test_the_metrics_port_is_a_tcp_port_or_none(app: Celery, port: int | None) -> None:
    app.conf.deadlines_metrics_port = port
    assert settings_for(app).get(METRICS_PORT) == port


@pytest.mark.parametrize("port", [-1, 0, 65536, "9808", 9808.0, True])
def test_a_metrics_port_that_is_not_a_tcp_port_is_a_configuration_error_naming_the_setting(
    app: Celery, port: object
) -> None:
    app.conf.deadlines_metrics_port = port
    with pytest.raises(ConfigurationError) as raised:
        settings_for(app).get(METRICS_PORT)
    message = str(raised.value)
    assert "deadlines_metrics_port" in message
    assert "CELERY_DEADLINES_METRICS_PORT" in message
    assert "from 1 to 65535" in message
    assert repr(port) in message


def test_a_worker_with_a_bad_metrics_port_logs_the_error_and_serves_nothing(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    install()
    app.conf.deadlines_metrics_port = -1
    with caplog.at_level(logging.INFO, logger="celery_deadlines"):
        worker_ready.send(sender=Consumer(app))
    [record] = [r for r in caplog.records if "metrics" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert "metrics not served" in record.getMessage()
    assert "CELERY_DEADLINES_METRICS_PORT" in record.getMessage()


class Consumer:
    """What ``worker_ready`` is sent by: the worker's consumer, with its app."""

    def __init__(self, app: Celery) -> None:
        self.app = app


@pytest.mark.parametrize(
    ("address", "bound"),
    [
        (None, "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),
        ("::", "::"),
        # written as the interpreter's ipaddress writes it (Python 3.13 changed the form)
        ("::ffff:10.0.0.1", str(ipaddress.ip_address("::ffff:10.0.0.1"))),
    ],
)
def test_the_metrics_are_served_on_this_machine_only_unless_an_address_is_named(
    app: Celery, monkeypatch: pytest.MonkeyPatch, address: str | None, bound: str
) -> None:
    from celery_deadlines.contrib import prometheus as metrics

    served: list[tuple[int, str]] = []
    monkeypatch.setattr(metrics, "serve", lambda port, addr: served.append((port, addr)))
    install()
    app.conf.deadlines_metrics_port = 9808
    if address is not None:
        app.conf.deadlines_metrics_address = address
    worker_ready.send(sender=Consumer(app))
    assert served == [(9808, bound)]


@pytest.mark.parametrize("address", ["localhost", "", "0.0.0.0/0", 127001])
def test_a_metrics_address_that_is_not_an_ip_address_is_logged_and_serves_nothing(
    app: Celery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, address: object
) -> None:
    from celery_deadlines.contrib import prometheus as metrics

    monkeypatch.setattr(metrics, "serve", lambda port, addr: pytest.fail("served"))
    install()
    app.conf.deadlines_metrics_port = 9808
    app.conf.deadlines_metrics_address = address
    with caplog.at_level(logging.INFO, logger="celery_deadlines"):
        worker_ready.send(sender=Consumer(app))
    [record] = [r for r in caplog.records if "metrics" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert "CELERY_DEADLINES_METRICS_ADDRESS" in record.getMessage()
