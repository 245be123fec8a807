"""`prefixscope analyze TRACE`: the offline analyzer's command line. No database, no Django.

    prefixscope analyze TRACE [--format F] [--block-size B] [--blocks N] [--no-curve]
                              [--jobs N] [--json | --html FILE]

TRACE `-` reads standard input; a trace compressed with gzip, bzip2, xz or zstd is read as it is.
Exit status 0 with a report, 2 for a usage error or a file that cannot be read.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from app.analyzer.readers import FORMATS, STDIN, read_trace
from app.analyzer.render import html_page, terminal_summary
from app.analyzer.report import Options, analyze
from app.analyzer.work import default_jobs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefixscope", description="Explains the prefix-cache misses of a trace."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("analyze", help="Analyze a JSON-lines request trace, offline.")
    command.add_argument(
        "trace", type=Path, help="a JSON-lines trace, - for standard input; gzip, bzip2, xz or zstd too"
    )
    command.add_argument(
        "--format", choices=FORMATS, help="the trace's format (default: sniffed from its first line)"
    )
    command.add_argument(
        "--block-size", type=_positive, help="tokens per KV block (default: the trace's hashes', else 16)"
    )
    command.add_argument("--blocks", type=_positive, help="KV blocks per server (default: unlimited)")
    command.add_argument("--no-curve", action="store_true", help="leave the what-if curve of capacity out")
    command.add_argument(
        "--jobs", type=_positive, default=default_jobs(), help="processes (default: the cores, at most 4)"
    )
    output = command.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    output.add_argument("--html", type=Path, metavar="FILE", help="write the report as a static HTML page")
    return parser


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; its exit status."""
    args = _parser().parse_args(argv)
    align = args.block_size if args.block_size else 64  # a buffer padded to 64 serves 16, 32 and 64 as is
    try:
        lines = read_trace(args.trace, format=args.format, align=align, jobs=args.jobs)
    except OSError as error:
        print(f"prefixscope: cannot read {args.trace}: {error.strerror or error}", file=sys.stderr)
        return 2
    options = Options(block_size=args.block_size, blocks=args.blocks, curve=not args.no_curve, jobs=args.jobs)
    source = "standard input" if args.trace == STDIN else args.trace.name
    report = analyze(lines, source=source, options=options)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(report), indent=1) + b"\n")
    elif args.html:
        args.html.write_text(html_page(report), encoding="utf-8")
        print(f"wrote {args.html}")
    else:
        print(terminal_summary(report))
    return 0


def run() -> None:
    """The console script's entry point: a one-shot process, so the collector's passes over the
    trace's millions of objects (none of them in a cycle that outlives the run) and their teardown
    at exit are skipped; the output is flushed first."""
    gc.disable()
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `| head` read what it wanted and left: no traceback over it
        status = 1
    sys.stderr.flush()
    os._exit(status)
