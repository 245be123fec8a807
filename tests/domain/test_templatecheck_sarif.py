"""A template check's SARIF log against the official SARIF 2.1.0 schema: every rule, findings with and
without a line, and what code scanning reads from each result (rule, level, file, line)."""

import re
from pathlib import Path

from app.domain.killers import KillerClass
from app.domain.templatecheck.check import Report, Result
from app.domain.templatecheck.findings import DESCRIPTIONS, Finding, Level, Rule
from app.domain.templatecheck.report import DOCS, sarif_report
from tests.support.sarif import sarif_problems

DOC = Path(__file__).resolve().parents[2] / DOCS


def _report(findings: list[Finding]) -> Report:
    result = Result("support", "templates/support.j2", "changed", findings=tuple(findings))
    return Report("a" * 40, "b" * 40, 16, "gpt2", (result,), "not priced (no --server)")


def _every_rule() -> list[Finding]:
    """One finding per rule, at every level, half of them without a line."""
    levels: tuple[Level, ...] = ("error", "warning", "note")
    return [
        Finding(
            rule, levels[i % 3], "support", "templates/support.j2", f"{rule} happened",
            line=i + 1 if i % 2 == 0 else None, token=i * 7 if i % 2 == 0 else None,
            variable="now" if i % 3 == 0 else None, klass=KillerClass.TIMESTAMP if i % 3 == 0 else None,
        )
        for i, rule in enumerate(Rule)
    ]  # fmt: skip


def test_a_log_with_every_rule_is_valid_sarif_and_locates_each_finding() -> None:
    findings = _every_rule()
    log = sarif_report(_report(findings), version="0.1.0")

    assert sarif_problems(log) == []
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [rule["id"] for rule in rules] == [rule.value for rule in Rule]
    assert len(run["results"]) == len(findings)
    for finding, result in zip(findings, run["results"], strict=True):
        assert (result["ruleId"], result["level"]) == (finding.rule.value, finding.level)
        assert rules[result["ruleIndex"]]["id"] == finding.rule.value
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] == finding.path
        assert location.get("region", {}).get("startLine") == finding.line
        assert result["message"]["text"] == finding.message


def test_a_passing_check_is_valid_sarif_with_no_results() -> None:
    log = sarif_report(_report([]), version="0.1.0")

    assert sarif_problems(log) == []
    assert log["runs"][0]["results"] == []


def test_the_schema_refuses_a_broken_log() -> None:
    """The validator is live: a result without its message, and a line 0, are refused."""
    log = sarif_report(_report(_every_rule()[:1]), version="0.1.0")
    result = log["runs"][0]["results"][0]
    del result["message"]
    result["locations"][0]["physicalLocation"]["region"]["startLine"] = 0

    problems = sarif_problems(log)

    assert any("message" in problem for problem in problems)
    assert any("startLine" in problem for problem in problems)


def test_each_rule_has_a_friendly_name_and_help_that_points_at_its_section() -> None:
    rules = sarif_report(_report([]), version="0.1.0")["runs"][0]["tool"]["driver"]["rules"]
    headings = re.findall(r"^#+ `?([a-z-]+)`?$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)

    for rule, entry in zip(Rule, rules, strict=True):
        # SARIF's friendly name is one Pascal-case identifier (the multitool's SARIF2012 asks for it).
        assert re.fullmatch(r"(?:[A-Z][a-z]+)+", entry["name"]), entry
        # ... and differs from the id even ignoring case (SARIF1001: else the name must be left out).
        assert entry["name"].lower() != entry["id"].lower(), entry
        assert entry["help"]["text"] == f"{DESCRIPTIONS[rule]} See {DOCS}#{rule.value}."
        assert rule.value in headings, f"{DOCS} has no section `{rule.value}`"
