"""Run the gateway: a reverse proxy that applications call instead of vLLM, recording every completion.

    manage.py gateway --listen 127.0.0.1:9000 --upstream http://vllm:8000 [--server NAME]

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

Recording never delays or fails a request: records wait in a bounded queue (full: the record is
dropped and counted as rejected input "queue full") for a writer thread; while PostgreSQL is down
they go to a spill file (JSON lines, owner-only), replayed and deleted once it is back. SIGTERM
drains the queue; SIGKILL loses the records still in memory (at most --queue-size plus
--batch-size), never one committed or spilled: a gateway started with the same spill file replays it.
"""

import argparse
import asyncio
import gc
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter
from django.db import InterfaceError, OperationalError
from django.utils.text import slugify

from app.env import env_str
from app.fleet.models import Server
from app.telemetry import configure_tracing
from app.traffic.gateway_writer import GatewayWriter
from collectors.gateway.proxy import serve


class _HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's option order, with the description's header table kept as written."""


class Command(BaseCommand):
    help = __doc__

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return super().create_parser(prog_name, subcommand, formatter_class=_HelpFormatter, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--listen", required=True, help="host:port to accept applications' requests on")
        parser.add_argument("--upstream", required=True, help="the vLLM server's base URL")
        parser.add_argument("--server", default="", help="the registered server's name (default: --upstream)")
        parser.add_argument(
            "--spill-file",
            default="",
            help="where records wait while PostgreSQL is down (default: "
            "$PREFIXSCOPE_DATA_DIR/gateway/<server>.jsonl, PREFIXSCOPE_DATA_DIR defaulting to .data/)",
        )
        parser.add_argument("--queue-size", type=int, default=10_000, help="records waiting, at most")
        parser.add_argument("--batch-size", type=int, default=500, help="records per database write")
        parser.add_argument("--flush-seconds", type=float, default=0.5, help="longest wait before a write")

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = _address(options["listen"])
        upstream = options["upstream"].rstrip("/")
        if urlsplit(upstream).scheme not in ("http", "https"):
            raise CommandError(f"--upstream {upstream!r}: expected an http:// or https:// URL")
        server = options["server"] or upstream
        if options["server"]:
            self._check_registered(options["server"])
        writer = GatewayWriter(
            server=server,
            spill_path=Path(options["spill_file"]) if options["spill_file"] else _default_spill(server),
            capacity=options["queue_size"],
            batch_size=options["batch_size"],
            flush_seconds=options["flush_seconds"],
        )
        configure_tracing("prefixscope-gateway")
        _keep_pauses_short()
        writer.start()
        try:
            # libuv's loop: the proxy's own CPU per request is what a client waits for.
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(_serve_until_signalled(host, port, upstream, writer))
        finally:
            writer.stop()
        self.stdout.write(
            f"gateway stopped: {writer.stored} records stored, {writer.spilled} spilled, "
            f"{writer.dropped} dropped (queue full)"
        )

    def _check_registered(self, name: str) -> None:
        try:
            known = Server.objects.filter(name=name).exists()
        except (OperationalError, InterfaceError) as exc:
            self.stderr.write(f"cannot check --server {name!r}, the database is unavailable: {exc}")
            return
        if not known:
            raise CommandError(f"--server {name!r}: no server has this name (register it, or leave it out)")


async def _serve_until_signalled(host: str, port: int, upstream: str, writer: GatewayWriter) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await serve(host, port, upstream, writer, stop)


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
    data = Path(env_str("PREFIXSCOPE_DATA_DIR", str(settings.BASE_DIR / ".data")))
    name = slugify(urlsplit(server).netloc if "://" in server else server) or "gateway"
    return data / "gateway" / f"{name}.jsonl"
