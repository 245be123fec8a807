"""Run the gateway: a reverse proxy that applications call instead of vLLM, recording every completion.

    manage.py gateway --listen 127.0.0.1:9000 --upstream http://vllm:8000 [--server NAME]

One process may front several servers: give --listen, --upstream (and --server) once per server,
in the same order (the demo of `make run` fronts its four simulated servers so).

Every request and answer passes unchanged, streams chunk by chunk. On /v1/completions and
/v1/chat/completions the gateway asks vLLM for the prompt token ids (and, for a stream, its usage)
and takes them out of the answer again, so clients get what vLLM would have sent them. Each
successful completion is stored as a request record of server NAME (else of the upstream URL; a
server nobody registered is proposed): TTFT as the client saw it, prompt, cached and completion
tokens from the usage, the prompt's block-hash chain, and the cache salt's hash.

Request headers it reads (all forwarded to vLLM unchanged; vLLM ignores them):
  X-Prefixscope-Tenant            the tenant the request is for
  X-Prefixscope-Template          the name of the prompt template the prompt was rendered from
  X-Prefixscope-Template-Version  that template's version: its commit sha in the template repository
  traceparent                     W3C trace context: the record's trace id
  X-Request-Id                    the request id when the answer has no id

Recording never delays or fails a request: records wait in a bounded queue per server (full: the
record is dropped and counted as rejected input "queue full") for the writer threads, --connections
of them (each on one database connection, sharing the servers); while PostgreSQL is down
they go to a spill file (JSON lines, owner-only), replayed and deleted once it is back. SIGTERM
drains the queue; SIGKILL loses the records still in memory (at most --queue-size plus
--batch-size), never one committed or spilled: a gateway started with the same spill file replays it.
"""

import argparse
import asyncio
import gc
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter
from django.db import InterfaceError, OperationalError, connection
from django.utils.text import slugify

from app.fleet.models import Server
from app.telemetry import configure_tracing
from app.traffic.collection.gateway_writer import GatewayWriter, WriterPool
from collectors.gateway.proxy import serve
from collectors.parts import digest_key


class _HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's option order, with the description's header table kept as written."""


class Command(BaseCommand):
    help = __doc__

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return super().create_parser(prog_name, subcommand, formatter_class=_HelpFormatter, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--listen", action="append", required=True, help="host:port to accept applications' requests on"
        )
        parser.add_argument("--upstream", action="append", required=True, help="the vLLM server's base URL")
        parser.add_argument(
            "--server", action="append", default=[], help="the registered server's name (default: --upstream)"
        )
        parser.add_argument(
            "--spill-file",
            default="",
            help="where records wait while PostgreSQL is down, with one server only (default: "
            "$PREFIXSCOPE_DATA_DIR/gateway/<server>.jsonl, PREFIXSCOPE_DATA_DIR defaulting to .data/)",
        )
        parser.add_argument("--queue-size", type=int, default=10_000, help="records waiting, at most")
        parser.add_argument("--batch-size", type=int, default=500, help="records per database write")
        parser.add_argument("--flush-seconds", type=float, default=0.5, help="longest wait before a write")
        parser.add_argument(
            "--connections",
            type=int,
            default=settings.PREFIXSCOPE_GATEWAY_CONNECTIONS,
            help="database connections the records are written on, however many servers are fronted "
            "(default: PREFIXSCOPE_GATEWAY_CONNECTIONS, 2)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        routes = self._routes(options["listen"], options["upstream"], options["server"])
        connection.close()  # the checks' connection: records are written on the pool's alone
        if options["connections"] < 1:
            raise CommandError("--connections: at least 1")
        if options["spill_file"] and len(routes) > 1:
            raise CommandError(
                "--spill-file: one server only (each server's records spill to a file of its own)"
            )
        writers = [
            GatewayWriter(
                server=route.server,
                spill_path=Path(options["spill_file"])
                if options["spill_file"]
                else _default_spill(route.server),
                capacity=options["queue_size"],
                batch_size=options["batch_size"],
                flush_seconds=options["flush_seconds"],
            )
            for route in routes
        ]
        pool = WriterPool(writers, connections=options["connections"])
        configure_tracing("prefixscope-gateway")
        _keep_pauses_short()
        pool.start()
        try:
            # libuv's loop: the proxy's own CPU per request is what a client waits for.
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(_serve_until_signalled(list(zip(routes, writers, strict=True))))
        finally:
            pool.stop()
        for writer in writers:
            self.stdout.write(
                f"gateway of {writer.server} stopped: {writer.stored} records stored, {writer.spilled} "
                f"spilled, {writer.dropped} dropped (queue full)"
            )

    def _routes(self, listens: list[str], upstreams: list[str], servers: list[str]) -> list["Route"]:
        if len(listens) != len(upstreams) or (servers and len(servers) != len(listens)):
            raise CommandError("give --listen and --upstream (and --server, if any) once per server")
        routes = []
        for index, (listen, upstream) in enumerate(zip(listens, upstreams, strict=True)):
            host, port = _address(listen)
            upstream = upstream.rstrip("/")
            if urlsplit(upstream).scheme not in ("http", "https"):
                raise CommandError(f"--upstream {upstream!r}: expected an http:// or https:// URL")
            if servers:
                self._check_registered(servers[index])
            routes.append(Route(host, port, upstream, servers[index] if servers else upstream))
        return routes

    def _check_registered(self, name: str) -> None:
        try:
            known = Server.objects.filter(name=name).exists()
        except (OperationalError, InterfaceError) as exc:
            self.stderr.write(f"cannot check --server {name!r}, the database is unavailable: {exc}")
            return
        if not known:
            raise CommandError(f"--server {name!r}: no server has this name (register it, or leave it out)")


@dataclass(frozen=True, slots=True)
class Route:
    """Where the gateway listens, the vLLM server behind it, and the server its records are of."""

    host: str
    port: int
    upstream: str
    server: str


async def _serve_until_signalled(routes: list[tuple[Route, GatewayWriter]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    key = digest_key(settings.SECRET_KEY)  # the request parts' digests (collectors/parts.py)
    n = settings.PREFIXSCOPE_GATEWAY_PART_STARTS_AT_ONCE  # part-start look-ups at once
    await asyncio.gather(
        *(
            serve(route.host, route.port, route.upstream, writer, stop, digest_key=key, starts_at_once=n)
            for route, writer in routes
        )
    )


def _keep_pauses_short() -> None:
    """Bound what the proxy waits for in its own process: the writer thread's hold on the GIL, and the
    garbage collector, which would otherwise rescan Django's start-up objects (tens of ms a time)."""
    sys.setswitchinterval(0.0005)
    gc.collect()
    gc.freeze()


def _address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"--listen {listen!r}: expected host:port, e.g. 127.0.0.1:9000")
    return host.strip("[]"), int(port)


def _default_spill(server: str) -> Path:
    data = settings.PREFIXSCOPE_DATA_DIR
    name = slugify(urlsplit(server).netloc if "://" in server else server) or "gateway"
    return data / "gateway" / f"{name}.jsonl"
