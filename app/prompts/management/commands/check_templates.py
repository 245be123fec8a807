"""Check a template repository's commit range before it ships: determinism, the boundary marker, the
stable prefix's change and golden copy, priced with a Prefixscope server's live traffic.

Exit status: 0 passed, 1 a failure (or a cost over --max-cost-per-hour), 2 the check could not run.
docs/template-check.md documents the describing file (prefixscope.yaml) and the output.
"""

import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from app.domain.templatecheck.check import EXIT_CANNOT_RUN, Report
from app.domain.templatecheck.report import json_report, sarif_report, text_report
from app.prompts.templatecheck.run import CannotCheck, CheckRequest, run_check

TOKEN_ENV = "PREFIXSCOPE_TOKEN"


class Command(BaseCommand):
    help = __doc__.splitlines()[0]
    requires_system_checks: list[str] = []  # runs in CI with no database; checks would want one

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--repo", required=True, help="the template repository: a local path or a URL")
        parser.add_argument("--base", required=True, help="the commit (or branch, tag) before the change")
        parser.add_argument("--head", required=True, help="the commit (or branch, tag) to check")
        parser.add_argument("--server", help="a Prefixscope server's base URL, to price the change")
        parser.add_argument("--hours", type=int, default=24, help="the traffic window to price with (hours)")
        parser.add_argument(
            "--require-server", action="store_true", help="exit 2 when the server does not answer"
        )
        parser.add_argument("--format", choices=("text", "json", "sarif"), default="text")
        parser.add_argument("--output", help="write the report to this file (default: standard output)")
        parser.add_argument("--max-cost-per-hour", type=float, help="fail when a change costs more an hour")
        parser.add_argument("--tokenizer", help="overrides prefixscope.yaml's tokenizer (gpt2 or a path)")
        parser.add_argument(
            "--no-commands", action="store_true", help="do not run builder commands the repository names"
        )
        parser.add_argument(
            "--update-golden",
            action="store_true",
            help="write head's stable prefixes to their golden files in --repo's work tree, to commit",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        request = CheckRequest(
            location=options["repo"], base=options["base"], head=options["head"], now=timezone.now(),
            server=options["server"], token=os.environ.get(TOKEN_ENV) or None, hours=options["hours"],
            max_cost_per_hour=options["max_cost_per_hour"], require_server=options["require_server"],
            allow_commands=not options["no_commands"], tokenizer=options["tokenizer"],
        )  # fmt: skip
        try:
            report = run_check(request, cache=Path(settings.PREFIXSCOPE_TEMPLATE_CACHE_DIR))
        except CannotCheck as exc:
            self.stderr.write(f"the check could not run: {exc}")
            sys.exit(EXIT_CANNOT_RUN)
        if options["update_golden"]:
            self._update_golden(report, Path(options["repo"]))
            return
        self._write(_formatted(report, options["format"]), options["output"])
        sys.exit(report.exit_status)

    def _update_golden(self, report: Report, root: Path) -> None:
        for result in report.results:
            if result.golden_path and result.head is not None:
                target = root / result.golden_path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(result.head.stable_text, encoding="utf-8")
                self.stdout.write(f"wrote {result.golden_path} ({result.head.stable_tokens:,} tokens)")

    def _write(self, text: str, output: str | None) -> None:
        if output:
            Path(output).write_text(text, encoding="utf-8")
        else:
            self.stdout.write(text, ending="")


def _formatted(report: Report, form: str) -> str:
    if form == "text":
        return text_report(report)
    body = json_report(report) if form == "json" else sarif_report(report, version=_version())
    return json.dumps(body, indent=2) + "\n"


def _version() -> str:
    try:
        return version("prefixscope")
    except PackageNotFoundError:
        return "0"
