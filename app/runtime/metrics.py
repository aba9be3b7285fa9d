"""The Prometheus endpoint of ``adattr run`` and ``adattr consume``: off unless
``ADATTR_METRICS_PORT`` is set, on the loopback address unless ``ADATTR_METRICS_HOST`` says
otherwise. What each command exposes is defined beside it (``pipelines/metrics.py``,
``app/budget/consumer.py``); this module only serves a registry."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server

from app.runtime.settings import Settings

log = logging.getLogger("adattr.metrics")


class MetricsError(RuntimeError):
    pass


def new_registry() -> CollectorRegistry:
    """A registry for one command's metrics, without the ``*_created`` series (a counter's
    creation time, which no dashboard of ours reads and which doubles every family shown)."""
    disable_created_metrics()
    return CollectorRegistry()


def serve(registry: CollectorRegistry, settings: Settings) -> None:
    """Serves ``registry`` at http://<host>:<port>/metrics from a daemon thread (it ends with
    the command)."""
    host, port = settings.metrics_host, settings.metrics_port
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror}); "
            "ADATTR_METRICS_PORT / ADATTR_METRICS_HOST choose another"
        ) from None
    log.info("metrics: http://%s:%d/metrics", host, port)
