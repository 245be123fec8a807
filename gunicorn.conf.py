"""gunicorn settings shared by `make run` and the production image."""

import os

bind = os.environ.get("PREFIXSCOPE_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# One thread: gunicorn's sync worker, which takes a connection only when it is idle, so the kernel
# hands each request to a free process. An ingest batch is CPU work (decoding spans, formatting the
# COPY) between database round trips, and a threaded worker (gthread) keeps accepting while busy: two
# batches then took turns on one process's interpreter lock while the other process idled (OTLP
# ingest on two cores, 2 senders: 0.39-0.45 of one COPY with 4 threads, 0.50-0.65 with 1; REST 0.62-0.65
# and 0.72-0.80). More than one thread serves slow pages beside each other, at that cost to ingest.
threads = int(os.environ.get("WEB_THREADS", "1"))
# Threaded workers only (the sync worker closes every connection): each request on a connection of
# its own (0: no keep-alive), so that it goes to whichever worker accepts first. Kept alive, a
# connection stays with the worker that took it: four exporters landed three on one worker.
keepalive = int(os.environ.get("WEB_KEEPALIVE_SECONDS", "0"))
accesslog = "-"
# gunicorn's default format, less `%(u)s`: it decodes an `Authorization: Basic` header's user name,
# and an ingest token sent as `curl -u <token>:` would be printed on every line of its requests.
access_log_format = '%(h)s %(l)s - %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'
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
