"""gunicorn settings shared by `make run` and the production image."""

import os

bind = os.environ.get("PREFIXSCOPE_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("WEB_THREADS", "4"))
# Each request on a connection of its own (0: no keep-alive), so that it goes to whichever worker
# accepts first, an idle one sooner than a busy one. Kept alive, a connection stays with the worker
# that took it: four exporters each sending over one connection landed three on one worker, whose
# Python (one core at most) became the bottleneck while the other worker idled (OTLP ingest: 34,800
# spans/s kept alive, 39,900 not, on two cores). A connection costs ~0.1 ms on a 15 ms batch, and a
# TLS proxy in front keeps its clients' connections alive either way.
keepalive = int(os.environ.get("WEB_KEEPALIVE_SECONDS", "0"))
accesslog = "-"
timeout = 60
# gunicorn's control socket defaults to one path in $HOME that every gunicorn would share.
control_socket_disable = True


def post_fork(server: object, worker: object) -> None:
    # Tracing is configured in each worker after the fork: exporter threads do not survive it.
    from app.telemetry import configure_tracing

    configure_tracing("prefixscope-web")


def post_worker_init(worker: object) -> None:
    # The application's modules, settings and URL patterns are loaded now and live as long as the
    # worker: out of the collector's sight, each collection of a batch's garbage no longer walks them
    # (an OTLP export of 512 spans spent ~10 ms of its ~40 in full collections before this).
    import gc

    gc.freeze()
