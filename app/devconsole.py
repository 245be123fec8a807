"""What `make run` prints: every process's output goes to a log file, and the console gets the few lines
a person watches (warnings, errors, regressions opened and resolved, alerts firing and resolved, the
run's own notices).

Each process logs in its own format (Django's text format, Celery's, gunicorn's, the simulator's),
so a line's level is read from its header; lines without one continue the record before them (a
traceback) when they look like it, and are otherwise left to the file. Imports no Django.
"""

import json
import re
import sys
from typing import TextIO

from honcho.printer import Message, Printer

SHOWN_LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL", "FATAL"})
REGRESSION = re.compile(r"regression (?:opened|resolved|open again)\b")
ALERT = re.compile(r"alert (?:firing|resolved): ")  # app/devprometheus.py's watcher
_HEADERS = (
    # Django's text format (settings.LOGGING) and the simulator's: "2026-01-01 10:00:00,123 INFO    name: msg"
    re.compile(r"\d{4}-\d\d-\d\d[ T][\d:.,]+\s+(?P<level>[A-Z]+)\s+[\w.]+: (?P<message>.*)"),
    # Celery's: "[2026-01-01 10:00:00,123: INFO/ForkPoolWorker-1] msg"
    re.compile(r"\[\d{4}-\d\d-\d\d [\d:.,]+: (?P<level>[A-Z]+)/[^\]]*\] (?P<message>.*)"),
    # gunicorn's error log: "[2026-01-01 10:00:00 +0000] [123] [INFO] msg"
    re.compile(r"\[\d{4}-\d\d-\d\d [^\]]*\] \[\d+\] \[(?P<level>[A-Z]+)\] (?P<message>.*)"),
    # Prometheus' logfmt: "ts=2026-01-01T10:00:00.123Z caller=main.go:1 level=error msg=..." (its level
    # `warn` is not shown: it logs its own SIGTERM at that level, at every Ctrl-C)
    re.compile(r"ts=\S+ caller=\S+ level=(?P<level>[a-z]+) (?P<message>.*)"),
    # Python's warnings: "/path/module.py:893: SecurityWarning: msg"
    re.compile(r"\S+:\d+: (?P<level>)\w*Warning: (?P<message>.*)"),
)
_CONTINUATION = re.compile(
    r"\s|Traceback |During handling |The above exception |[\w.]+(Error|Exception|Exit)\b"
)


def parse_header(line: str) -> tuple[str, str] | None:
    """(level, message) of a log line's header, level "WARNING" for a Python warning; None for a line
    without one (a traceback's, a banner's, an access log's)."""
    if line.startswith("{"):  # LOG_FORMAT=json
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if isinstance(record, dict) and isinstance(record.get("level"), str):
            return record["level"], str(record.get("message", ""))
        return None
    for header in _HEADERS:
        found = header.match(line)
        if found:
            return found["level"].upper() or "WARNING", found["message"]
    return None


class ConsolePrinter(Printer):  # type: ignore[misc]  # honcho has no type hints
    """honcho's printer writing every line to `log` (honcho's format, no colours) and the lines
    `shown` picks to `console`: a regression's or an alert's line as the time and its message, others
    as honcho prints them."""

    def __init__(self, log: TextIO, console: TextIO = sys.stdout) -> None:
        super().__init__(log, colour=False)
        self.console = console
        self._shown: dict[str, bool] = {}  # per process: whether its last record went to the console

    def write(self, message: Message, *, console: bool | None = None) -> None:
        """Write to the log file, and to the console what `console` says (None: what `shown` picks)."""
        super().write(message)
        data = message.data.decode("utf-8", "replace") if isinstance(message.data, bytes) else message.data
        time = message.time.strftime(self.time_format)
        name = (message.name or "").ljust(self.width)
        for line in data.splitlines():
            header = parse_header(line)
            said = header[1] if header is not None else ""
            if console is None and (REGRESSION.match(said) or ALERT.match(said)):
                print(f"{time} {said}", file=self.console, flush=True)
            elif console or (console is None and self.shown(message.name or "", line, header)):
                print(f"{time} {name} | {line}", file=self.console, flush=True)

    def shown(self, process: str, line: str, header: tuple[str, str] | None) -> bool:
        """Whether a process's line goes to the console: a warning or worse, and the lines that
        continue it (indented, a traceback's)."""
        if header is not None:
            self._shown[process] = header[0] in SHOWN_LEVELS
        elif not _CONTINUATION.match(line):
            self._shown[process] = False
        return self._shown.get(process, False)
