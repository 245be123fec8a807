"""A recording of real scrapes (deploy/prometheus/recordings/record.py) as `promtool test rules` input,
and the alert timeline promtool evaluates on it.

The series are what Prometheus would have stored: each target's samples with its `job` and `instance`
labels, `up` per target, a staleness marker where a series stops. promtool's clock starts at 0, so
every timestamp-valued series (`*_timestamp_seconds`, `*_created`, `process_start_time_seconds`) is
shifted by the recording's start: `time() - x` means what it meant when it was scraped.
"""

import json
import lzma
import math
import re
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

STEP_SECONDS = 15
Labels = tuple[tuple[str, str], ...]
_CLOCK = re.compile(r"(_timestamp_seconds|_created|^process_start_time_seconds)$")


@dataclass(frozen=True)
class Recording:
    start: float  # unix seconds of the first scrape: promtool's time 0
    steps: int
    series: dict[Labels, list[float | None]]  # (("__name__", ...), ...) -> value per step, None: absent


def _scrapes(path: Path) -> Iterator[dict[str, Any]]:
    with lzma.open(path, "rt") as lines:
        for line in lines:
            yield json.loads(line)


def load(path: Path) -> Recording:
    scrapes = list(_scrapes(path))
    start = min(scrape["t"] for scrape in scrapes)
    steps = max(round((scrape["t"] - start) / STEP_SECONDS) for scrape in scrapes) + 1
    series: dict[Labels, list[float | None]] = defaultdict(lambda: [None] * steps)
    for scrape in scrapes:
        step = round((scrape["t"] - start) / STEP_SECONDS)
        target = {"job": scrape["job"], "instance": scrape["instance"]}
        series[_key("up", target)][step] = 1.0 if scrape["up"] else 0.0
        for family in text_string_to_metric_families(scrape["text"]):
            for sample in family.samples:
                value = sample.value - start if _CLOCK.search(sample.name) else sample.value
                series[_key(sample.name, {**sample.labels, **target})][step] = value
    return Recording(start=start, steps=steps, series=dict(series))


def _key(name: str, labels: dict[str, str]) -> Labels:
    return (("__name__", name), *sorted(labels.items()))


def without_job(recording: Recording, job: str) -> Recording:
    """The recording as a Prometheus that does not scrape `job` would have it."""
    kept = {key: values for key, values in recording.series.items() if ("job", job) not in key}
    return Recording(start=recording.start, steps=recording.steps, series=kept)


def _value(value: float | None, before: float | None) -> str:
    if value is None:
        return "stale" if before is not None else "_"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)


def _series_text(key: Labels) -> str:
    name = dict(key)["__name__"]
    labels = ", ".join(f"{label}={json.dumps(value)}" for label, value in key if label != "__name__")
    return f"{name}{{{labels}}}"


def input_series(recording: Recording) -> list[dict[str, str]]:
    return [
        {
            "series": _series_text(key),
            "values": " ".join(_value(v, values[i - 1] if i else None) for i, v in enumerate(values)),
        }
        for key, values in recording.series.items()
    ]


@dataclass(frozen=True)
class Alert:
    name: str
    labels: Labels  # the alert's labels, alertstate left out


Timeline = dict[Alert, dict[str, list[int]]]  # alert -> {"pending": [seconds], "firing": [seconds]}


def _rules_without_annotations(rule_files: list[Path], into: Path) -> list[str]:
    """The rule files without annotations: the timeline is about which alerts fire when; the
    annotations' templates (some query Prometheus) are unit-tested with the rules."""
    written = []
    for path in rule_files:
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        copy = into / path.name
        copy.write_text(yaml.safe_dump(rules, sort_keys=False))
        written.append(copy.name)
    return written


_GOT = re.compile(r'expr: "ALERTS", time: (?P<time>\S+),\s+exp: nil\s+got: (?P<got>.*)')
_SAMPLE = re.compile(r"\{(?P<labels>[^}]*)\}")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def alert_timeline(recording: Recording, rule_files: list[Path], workdir: Path, promtool: str) -> Timeline:
    """Every alert pending or firing at each 15 s evaluation, as promtool evaluates the rules on the
    recording (one `ALERTS` query per step, expected empty: promtool prints what it got)."""
    test = {
        "rule_files": _rules_without_annotations(rule_files, workdir),
        "evaluation_interval": f"{STEP_SECONDS}s",
        "tests": [
            {
                "interval": f"{STEP_SECONDS}s",
                "input_series": input_series(recording),
                "promql_expr_test": [
                    {"expr": "ALERTS", "eval_time": f"{step * STEP_SECONDS}s", "exp_samples": []}
                    for step in range(recording.steps)
                ],
            }
        ],
    }
    test_file = workdir / "timeline.test.yml"
    test_file.write_text(yaml.safe_dump(test, sort_keys=False, width=1 << 20))
    result = subprocess.run(
        [promtool, "test", "rules", test_file.name],
        capture_output=True,
        text=True,
        cwd=workdir,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    if result.returncode not in (0, 1) or ("FAILED" in output and not _GOT.search(output)):
        raise RuntimeError(f"promtool failed on the recording:\n{output[-4000:]}")
    return _parse(output)


def _seconds(text: str) -> int:
    total, number = 0, ""
    for char in text:
        if char.isdigit():
            number += char
        else:
            total += int(number) * {"h": 3600, "m": 60, "s": 1}[char]
            number = ""
    return total


def _parse(output: str) -> Timeline:
    timeline: Timeline = defaultdict(lambda: {"pending": [], "firing": []})
    for match in _GOT.finditer(output):
        at = _seconds(match["time"])
        for sample in _SAMPLE.finditer(match["got"]):
            labels = dict(_LABEL.findall(sample["labels"]))
            state = labels.pop("alertstate")
            labels.pop("__name__")
            name = labels.pop("alertname")
            timeline[Alert(name, tuple(sorted(labels.items())))][state].append(at)
    return dict(timeline)
