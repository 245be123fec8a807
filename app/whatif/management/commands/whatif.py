"""Answer a what-if in the terminal: a scope's window replayed as the fleet was (the calibration) and
under other KV capacities, routings, server counts, block sizes, salts, computed here, synchronously
(no task broker needed), through the same service as the What-if page and the API.

Exit status: 0 answered (a poor calibration too: it says its answers are not to be trusted), 2 the
arguments are wrong or the scope has nothing to replay in the window.
"""

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from app.domain.replay.calibration import Calibration, Trust
from app.domain.replay.whatif import Answer, WhatIf, scaled_blocks
from app.whatif.results import answers_out
from app.whatif.services import Asked, NothingToReplay, Scope, ScopeKind, ask, window_problem

EXIT_CANNOT_ANSWER = 2
DEFAULT_MINUTES = 10
POOR_WARNING = "WARNING: the replay does not reproduce this fleet: the answers below are not to be trusted"
MONEY_HEADERS = ("hit rate", "saved tok/h", "GPU-s/h", "$/h", "TTFT saved ms")


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--scope", choices=[k.value for k in ScopeKind], default="fleet")
        parser.add_argument("--name", default="", help="the group's or template's name")
        parser.add_argument("--minutes", type=int, help="the last so many minutes, ending now (default 10)")
        parser.add_argument("--since", help="the window's start, ISO 8601 (instead of --minutes)")
        parser.add_argument("--until", help="the window's end, ISO 8601 (default: now)")
        parser.add_argument("--json", action="store_true", help="the answers as the API gives them")

    def handle(self, *args: Any, **options: Any) -> None:
        scope = _scope(options["scope"], options["name"])
        since, until = _window(options, now=timezone.now())
        try:
            asked = ask(scope=scope, since=since, until=until)
        except NothingToReplay as exc:
            raise CommandError(str(exc), returncode=EXIT_CANNOT_ANSWER) from None
        if options["json"]:
            self.stdout.write(json.dumps(_json(asked), indent=2))
        else:
            self._report(asked)

    def _report(self, asked: Asked) -> None:
        answers = asked.answers
        self.stdout.write(calibration_line(answers.calibration))
        if not answers.trusted and answers.calibration.trust is Trust.POOR:
            self.stdout.write(self.style.WARNING(POOR_WARNING))
        self.stdout.write(_replayed_line(asked))
        for title, table in _tables(answers):
            self.stdout.write(f"\n{title}\n{table}")
        priced = f"Answers {answers.price}. " if answers.price else ""
        self.stdout.write(f"\n{priced}{answers.leaves_out}")


def calibration_line(calibration: Calibration) -> str:
    """The calibration in one line: trust, replayed against reported hit rate, the error, the exact."""
    if calibration.trust is Trust.UNKNOWN:
        return "calibration: unknown (no request of the window reported its cached tokens)"
    return (
        f"calibration: {calibration.trust.value}: "
        f"replayed hit rate {_percent(calibration.replayed_hit_rate)} "
        f"vs reported {_percent(calibration.reported_hit_rate)} ({calibration.error_points:+.1f} points); "
        f"{_percent(calibration.exact_share)} of {calibration.requests:,} requests exact"
        + (
            f"; not compared: {', '.join(calibration.uncompared)} (hit counter not wired)"
            if calibration.uncompared
            else ""
        )
    )


def _replayed_line(asked: Asked) -> str:
    answers = asked.answers
    line = (
        f"{asked.scope}, {asked.since.astimezone(UTC):%Y-%m-%d %H:%M:%S} to "
        f"{asked.until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC: "
        f"{answers.requests:,} requests, {answers.prompt_tokens:,} prompt tokens, "
        f"{len(answers.servers)} servers, blocks of {answers.block_size} tokens"
    )
    if asked.unknown_prompt:
        line += f"; {asked.unknown_prompt:,} records without a prompt token count left out"
    if asked.left_out_servers:
        line += f"; left out (KV blocks or block size unknown or other): {', '.join(asked.left_out_servers)}"
    return line


def _tables(answers: WhatIf) -> list[tuple[str, str]]:
    capacity = [
        [f"{a.factor:g}x", f"{sum(scaled_blocks(s.num_blocks, a.factor or 1) for s in answers.servers):,}",
         *_figures(a)]
        for a in answers.capacity
    ]  # fmt: skip
    found = [("Capacity", _table(("factor", "KV blocks", *MONEY_HEADERS), capacity))]
    sizes = "Block sizes" + _left_out(answers.block_sizes_left_out)
    families = (
        ("Routing", answers.routing, ""),
        ("Server counts", answers.server_counts, ""),
        (sizes, answers.block_sizes, "(none: no server kept the token ids of all its requests)"),
        ("Salts", answers.salts, "(none: no request was salted)"),
        ("Restore", answers.restored, "(none: no server had more KV blocks in the last day)"),
    )
    for title, rows, empty in families:
        body = _table(("", *MONEY_HEADERS), [[a.label, *_figures(a)] for a in rows]) if rows else empty
        found.append((title, body))
    return found


def _figures(answer: Answer) -> list[str]:
    return [
        _percent(answer.hit_rate), _fixed(answer.saved_tokens_per_hour, 0),
        _fixed(answer.gpu_seconds_per_hour, 1), _fixed(answer.money_per_hour, 2),
        _fixed(answer.ttft_saved_seconds * 1000, 1),
    ]  # fmt: skip


def _fixed(value: float, digits: int) -> str:
    """`value` to `digits` decimals, with thousands separators; what rounds to zero is 0, never -0."""
    return f"{round(value, digits) + 0.0:,.{digits}f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned: the first to the left, the figures to the right."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        return "  ".join(
            [first.ljust(widths[0]), *(c.rjust(w) for c, w in zip(rest, widths[1:], strict=True))]
        )

    return "\n".join([line(headers), *(line(row) for row in rows)])


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _json(asked: Asked) -> dict[str, Any]:
    return {
        "scope": asked.scope.kind.value, "name": asked.scope.name, "since": asked.since.isoformat(),
        "until": asked.until.isoformat(), "unknown_prompt": asked.unknown_prompt,
        "left_out_servers": list(asked.left_out_servers), "answers": answers_out(asked.answers),
    }  # fmt: skip


def _scope(kind: str, name: str) -> Scope:
    if kind == ScopeKind.FLEET and name:
        raise CommandError("the fleet takes no --name", returncode=EXIT_CANNOT_ANSWER)
    if kind != ScopeKind.FLEET and not name:
        raise CommandError(f"--scope {kind} needs --name", returncode=EXIT_CANNOT_ANSWER)
    return Scope(ScopeKind(kind), name)


def _window(options: dict[str, Any], *, now: datetime) -> tuple[datetime, datetime]:
    """The window the options ask for; a CommandError (exit 2) saying what is wrong with it."""
    if options["minutes"] is not None and (options["since"] or options["until"]):
        raise CommandError(
            "give either --minutes or --since (and --until), not both", returncode=EXIT_CANNOT_ANSWER
        )
    if options["since"] is None:
        if options["until"]:
            raise CommandError("--until needs --since", returncode=EXIT_CANNOT_ANSWER)
        minutes = DEFAULT_MINUTES if options["minutes"] is None else options["minutes"]
        since, until = now - timedelta(minutes=minutes), now
    else:
        since = _moment(options["since"], "--since")
        until = _moment(options["until"], "--until") if options["until"] else now
    problem = window_problem(since, until)
    if problem is not None:
        raise CommandError(problem, returncode=EXIT_CANNOT_ANSWER)
    return since, until


def _moment(text: str, option: str) -> datetime:
    moment = parse_datetime(text)
    if moment is None:
        raise CommandError(f"{option} {text!r} is not an ISO 8601 time", returncode=EXIT_CANNOT_ANSWER)
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def _left_out(servers: tuple[str, ...]) -> str:
    """What the block sizes leave out: servers some of whose requests kept no token ids."""
    return f" (without {', '.join(servers)}: token ids not kept)" if servers else ""
