"""The metrics that Prometheus rules read: each rule's selectors, parsed with a real PromQL parser.

promql-parser (the Python binding of GreptimeTeam's Rust PromQL parser) builds the expression's tree,
so function names, keywords (by, on, ignoring, group_left, offset, bool...), label names, strings
and durations are never taken for metric names, as a tokenizer could.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml


@dataclass(frozen=True, slots=True)
class Selector:
    """One vector selector of a rule: the metric it names (None when `__name__` is a regex) and the
    selector as PromQL, its label matchers included, its offset and range left out."""

    name: str | None
    promql: str


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a rule file: its group, its name (`record` or `alert`) and its expression."""

    file: Path
    group: str
    name: str
    expr: str
    records: bool


def load_rules(files: list[Path]) -> list[Rule]:
    """Every rule of `files`, in file and group order."""
    rules = []
    for path in files:
        groups: list[dict[str, Any]] = yaml.safe_load(path.read_text())["groups"]
        for group in groups:
            for rule in group["rules"]:
                records = "record" in rule
                name = rule["record"] if records else rule["alert"]
                rules.append(Rule(path, group["name"], name, rule["expr"], records))
    return rules


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of `expr` (inside functions, aggregations, ranges and subqueries too),
    each once, in the order the expression reads them."""
    found: list[Selector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            selector = _selector(node)
            if selector not in found:
                found.append(selector)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return found


def _selector(node: promql_parser.VectorSelector) -> Selector:
    matchers = node.matchers.matchers
    name = node.name
    if name is None:  # {__name__="x"}: the name is one of the matchers
        name = next(
            (m.value for m in matchers if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal),
            None,
        )
    labels = ",".join(str(matcher) for matcher in matchers)
    promql = f"{node.name}{{{labels}}}" if node.name is not None else f"{{{labels}}}"
    return Selector(name, promql)


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` reads."""
    return {selector.name for selector in selectors(expr) if selector.name is not None}


def scraped_selectors(rules: list[Rule]) -> list[Selector]:
    """The selectors of `rules` over scraped metrics: those over a name that a rule records are left
    out (the rules produce them, and a recording may rightly be empty for want of history)."""
    recorded = {rule.name for rule in rules if rule.records}
    found: list[Selector] = []
    for rule in rules:
        for selector in selectors(rule.expr):
            if selector.name not in recorded and selector not in found:
                found.append(selector)
    return found
