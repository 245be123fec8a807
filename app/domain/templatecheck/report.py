"""A check's report for people (text), for scripts (JSON) and for code scanning (SARIF 2.1.0: GitHub and
GitLab read it and put each finding on its line of the diff)."""

from __future__ import annotations

from typing import Any, Final

from app.domain.templatecheck.analysis import Side
from app.domain.templatecheck.check import Report, Result
from app.domain.templatecheck.findings import DESCRIPTIONS, Finding, Rule

SARIF_SCHEMA: Final = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL: Final = "prefixscope-template-check"
DOCS: Final = "docs/template-check.md"
_SARIF_LEVELS: Final = {"error": "error", "warning": "warning", "note": "note"}
_VERDICTS: Final = {0: "passed", 1: "failed", 2: "could not run"}


def text_report(report: Report) -> str:
    """The summary a person reads in a CI log: one paragraph per template, then the verdict."""
    lines = [
        f"Template check {report.base[:12]}..{report.head[:12]}: {len(report.results)} templates, "
        f"tokenizer {report.tokenizer}, blocks of {report.block_size} tokens; {report.pricing}."
    ]
    for result in report.results:
        lines += ["", *_template_lines(result)]
    lines += ["", *report.notes] if report.notes else []
    errors = sum(1 for f in report.findings if f.level == "error")
    lines += ["", f"{_VERDICTS[report.exit_status].upper()}: {errors} error(s)."]
    return "\n".join(lines) + "\n"


def _template_lines(result: Result) -> list[str]:
    head = [f"{result.name} ({result.path}, {result.state})"]
    if result.base is not None:
        head.append(f"  base: {_side(result.base)}")
    if result.head is not None:
        head.append(f"  head: {_side(result.head)}")
    if result.predicted is not None:
        p = result.predicted
        verb = "more" if p.tokens_per_hour >= 0 else "fewer"
        head.append(
            f"  price: at {p.requests_per_hour:,.0f} requests/h (last {p.window_hours:.0f} h), reuse "
            f"{p.reused_before:,.0f} -> {p.reused_after:,.0f} tokens/request: {abs(p.tokens_per_hour):,.0f} "
            f"{verb} prefill tokens/h, {abs(p.gpu_seconds_per_hour):,.1f} GPU-s/h, "
            f"${abs(p.money_per_hour):,.2f}/h ({p.prefill_rate_source} prefill rate "
            f"{p.prefill_tokens_per_second:,.0f} tokens/s)"
        )
    head += [f"  {f.level.upper()} {f.rule}: {f.message}" for f in result.findings]
    return head


def _side(side: Side) -> str:
    ends = side.ends
    why = ""
    if ends is not None:
        where = f"line {ends.line}: " if ends.line else ""
        why = f", ends at {where}`{ends.variable or ends.label}` ({ends.klass})"
    return f"stable prefix {side.stable_tokens:,} tokens, {side.reusable_blocks} reusable blocks{why}"


def json_report(report: Report) -> dict[str, Any]:
    """The report as JSON values (no prompt text: lengths, positions, lines and classes)."""
    return {
        "base": report.base, "head": report.head, "block_size": report.block_size,
        "tokenizer": report.tokenizer, "pricing": report.pricing,
        "max_cost_per_hour": report.max_cost_per_hour, "exit_status": report.exit_status,
        "verdict": _VERDICTS[report.exit_status],
        "templates": [_result_json(result) for result in report.results],
        "findings": [_finding_json(finding) for finding in report.findings],
    }  # fmt: skip


def _result_json(result: Result) -> dict[str, Any]:
    change = result.change
    predicted = result.predicted
    return {
        "name": result.name, "path": result.path, "state": result.state,
        "base": _side_json(result.base), "head": _side_json(result.head),
        "change": None if change is None else {
            "direction": change.direction, "departs_at_token": change.departs_at, "line": change.line,
            "base_tokens": change.base_tokens, "head_tokens": change.head_tokens,
            "base_blocks": change.base_blocks, "head_blocks": change.head_blocks,
        },
        "predicted": None if predicted is None else {
            "requests_per_hour": predicted.requests_per_hour, "reused_tokens_before": predicted.reused_before,
            "reused_tokens_after": predicted.reused_after,
            "prefill_tokens_per_hour": predicted.tokens_per_hour,
            "gpu_seconds_per_hour": predicted.gpu_seconds_per_hour, "cost_per_hour": predicted.money_per_hour,
            "prefill_tokens_per_second": predicted.prefill_tokens_per_second,
            "prefill_rate_source": predicted.prefill_rate_source, "window_hours": predicted.window_hours,
        },
    }  # fmt: skip


def _side_json(side: Side | None) -> dict[str, Any] | None:
    if side is None:
        return None
    ends = side.ends
    return {
        "stable_tokens": side.stable_tokens, "reusable_blocks": side.reusable_blocks,
        "renders": len(side.prompts),
        "ends": None if ends is None else {
            "token": ends.token, "line": ends.line, "variable": ends.variable, "cause": ends.label,
            "class": ends.klass.value,
        },
    }  # fmt: skip


def _finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "rule": finding.rule.value, "level": finding.level, "template": finding.template,
        "path": finding.path,
        "line": finding.line, "token": finding.token, "variable": finding.variable,
        "class": finding.klass.value if finding.klass else None, "message": finding.message,
    }  # fmt: skip


def sarif_report(report: Report, *, version: str) -> dict[str, Any]:
    """The report as a SARIF 2.1.0 log: one run, one rule per Rule, one result per finding, located
    at its file (and line) relative to the repository root."""
    rules = list(Rule)
    driver = {
        "name": TOOL, "version": version,
        "rules": [{"id": rule.value, "name": rule_name(rule),
                   "shortDescription": {"text": DESCRIPTIONS[rule]},
                   "help": {"text": f"{DESCRIPTIONS[rule]} See {DOCS}#{rule.value}."}}
                  for rule in rules],
    }  # fmt: skip
    results = [_sarif_result(finding, rules.index(finding.rule)) for finding in report.findings]
    run = {
        "tool": {"driver": driver},
        "results": results,
        "properties": {"base": report.base, "head": report.head},
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def rule_name(rule: Rule) -> str:
    """The rule's SARIF friendly name: one Pascal-case identifier (the multitool's SARIF2012), other than
    its id even ignoring case (SARIF1001: the id is opaque, the name is for people)."""
    return _NAMES.get(rule) or "".join(part.capitalize() for part in rule.value.split("-"))


_NAMES: Final = {Rule.NONDETERMINISTIC: "NondeterministicRender"}  # one word: its id in capitals is the id


def _sarif_result(finding: Finding, rule_index: int) -> dict[str, Any]:
    location: dict[str, Any] = {"artifactLocation": {"uri": finding.path}}
    if finding.line is not None:
        location["region"] = {"startLine": finding.line}
    properties = {"template": finding.template, "token": finding.token, "variable": finding.variable,
                  "class": finding.klass.value if finding.klass else None}  # fmt: skip
    return {
        "ruleId": finding.rule.value, "ruleIndex": rule_index, "level": _SARIF_LEVELS[finding.level],
        "message": {"text": finding.message},
        "locations": [{"physicalLocation": location}],
        "partialFingerprints": {"prefixscope/v1": _fingerprint(finding)},
        "properties": {key: value for key, value in properties.items() if value is not None},
    }  # fmt: skip


def _fingerprint(finding: Finding) -> str:
    """What stays the same for one problem across commits (code scanning tracks it by this)."""
    return ":".join((finding.rule, finding.template, finding.variable or ""))
