"""How long a template check takes: 50 templates of 20 renders each, checked (every render under its
perturbation, tokenized with the bundled GPT-2 tokenizer, determinism, the stable prefix and what ends
it), against rendering the same contexts alone.

Run from the repository root:
    .venv/bin/python -m bench template_check [--templates 50]

The templates are the demo scenario's three (simulator/scenarios/) with the describing file its
repository carries (simulator/template_describe.py), each copied under another name with a line of its
own on top, so that no two are the same text. Each keeps the file's three samples; with the
perturbations (clock, time zone, seed, the order of `tools` and `chunks`, the key order of mappings)
and the swaps of its per-request and per-user variables that is 23 to 29 renders a template, at least
the issue's 20 (the total is printed). The baseline compiles and renders the same contexts with a
plain sandboxed Jinja environment. The figures are CPU seconds of this process (the check runs in one
process, on one core). Target: the whole check under 10 s of CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.domain.templatecheck.analysis import Template, Wrap
from app.domain.templatecheck.check import Pair, check_pairs
from app.domain.templatecheck.config import CheckConfig, TemplateEntry, parse_config
from app.domain.templatecheck.perturb import Conditions, Variant, perturbations, swaps
from app.domain.templatecheck.render import CheckedTemplate
from app.prompts.templatecheck.tokenizers import LoadedTokenizer, load_tokenizer
from bench.harness import print_baseline, print_figure, verdict
from simulator.scenario import load_scenario, resolve_scenario
from simulator.template_describe import describe

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
NOW = Conditions(START)
TARGET_SECONDS = 10.0
SAMPLES = 3


@dataclass(frozen=True, slots=True)
class Source:
    """One template to check: its name, file, text and describing entry."""

    name: str
    path: str
    text: str
    entry: TemplateEntry


def workload(count: int) -> tuple[list[Source], CheckConfig]:
    """``count`` distinct templates with the demo's entries (``SAMPLES`` samples each), and its config."""
    scenario = load_scenario(resolve_scenario("demo"))
    config = parse_config(describe(scenario, scenario.servers.block_size, START))
    texts = {t.name: t.text for t in scenario.templates}
    found = []
    for index in range(count):
        entry = config.templates[index % len(config.templates)]
        entry = entry.model_copy(update={"samples": entry.samples[:SAMPLES]})
        name = entry.files[0].removeprefix("templates/").removesuffix(".j2")
        text = f"Assistant {index} of the help desk.\n" + texts[name]
        found.append(Source(f"{name}-{index}", f"templates/{name}-{index}.j2", text, entry))
    return found, config


def variants(entry: TemplateEntry) -> list[Variant]:
    """Every render one check of ``entry`` makes (analysis.check_side's list)."""
    found = [v for s in range(len(entry.samples)) for v in perturbations(entry, s, NOW, command=False)]
    return found + swaps(entry, NOW)


def render_alone(sources: Sequence[Source], config: CheckConfig) -> int:
    """The baseline: each template compiled in a plain sandboxed environment, its variants rendered."""
    environment = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, autoescape=False, **config.jinja.model_dump()
    )
    environment.filters["dumps"] = json.dumps
    renders = 0
    for source in sources:
        compiled = environment.from_string(source.text)
        for variant in variants(source.entry):
            local = variant.conditions.local_now
            compiled.render({"now": lambda t=local: t, **variant.context})
            renders += 1
    return renders


def check(sources: Sequence[Source], config: CheckConfig, tokenizer: LoadedTokenizer) -> int:
    """The check of each template as an added file (so its head alone is checked); the renders made."""
    pairs = []
    for s in sources:
        render = CheckedTemplate(s.text, config.jinja, name=s.path).render
        template = Template(s.name, s.path, s.text, s.entry, render, _wrap(tokenizer, s.entry))
        pairs.append(Pair(s.name, s.path, None, template))
    results = check_pairs(
        pairs, tokenizer, block_size=config.block_size, now=NOW, traffic=None, max_cost_per_hour=None
    )
    return sum(len(r.head.prompts) for r in results if r.head is not None)


def _wrap(tokenizer: LoadedTokenizer, entry: TemplateEntry) -> Wrap:
    if entry.kind != "chat":
        return lambda text, context: text

    def wrap(text: str, context: Mapping[str, Any]) -> str:
        return tokenizer.wrap(text, context, user=entry.user)

    return wrap


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench template_check")
    parser.add_argument("--templates", type=int, default=50)
    args = parser.parse_args(argv)
    sources, config = workload(args.templates)
    tokenizer = load_tokenizer("gpt2", root=None)
    check(sources[:3], config, tokenizer)  # warm up: the tokenizer's and Jinja's first calls

    started = time.process_time()
    renders = render_alone(sources, config)
    alone = time.process_time() - started
    started = time.process_time()
    checked = check(sources, config, tokenizer)
    spent = time.process_time() - started

    assert checked == renders, (checked, renders)
    print_baseline(f"{len(sources)} templates rendered alone", alone, "s CPU", f"{renders} renders")
    print_figure(
        f"{len(sources)} templates checked", spent, "s CPU", alone,
        f"{verdict(spent < TARGET_SECONDS)} (target < {TARGET_SECONDS:.0f} s); {checked} renders",
    )  # fmt: skip
