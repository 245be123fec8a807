"""Scenarios for the simulated fleet: the YAML format, its loader, and the template edits of its timeline.

A scenario says how many servers there are, which tenants and prompt templates send traffic, at what
rate, how requests are routed, and what changes at which virtual second: template commits (ordinary
edits or injected cache-killing faults), tenant salt changes, capacity cuts and server restarts.
``simulator/scenarios/demo.yaml`` shows every field. Every loader error is a ``ScenarioError`` whose
``field`` is the path of the bad field, e.g. ``tenants[1].weight`` or ``timeline[0].change.fault``.

Templates are Jinja. They see these variables, built per request by ``simulator.loadgen``:
``now`` (the request's time, a string), ``request_id``, ``tenant``, ``question`` (one of the template's
questions), and the template's ``tools`` (name/description mappings), ``schema`` (a mapping) and
``chunks`` (strings). The application hands ``tools``, ``schema`` keys and ``chunks`` over in a
different order on every request, as code that builds them from sets or merged dicts does; a
cache-friendly template normalizes them (``tools | sort(attribute="name")``, ``schema | tojson``,
which sorts keys, ``chunks | sort``), and the faults are the commits that undo this.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

import jinja2
import jinja2.meta
import yaml

Kind = Literal["completion", "chat"]
Routing = Literal["random", "round_robin", "prefix_aware"]
Fault = Literal["volatile_top", "unsorted_tools", "random_json_keys", "shuffled_chunks"]

SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"
TEMPLATE_VARIABLES = ("now", "request_id", "tenant", "question", "tools", "schema", "chunks")
MIN_BLOCKS = 2
"""num_blocks counts vLLM's null block (as --num-gpu-blocks-override does), so 2 is the least that caches."""
DEFAULT_VOLATILE_LINE = "Current time: {{ now }} | Request ID: {{ request_id }}"
"""What ``volatile_top`` puts at the top when the template has no line with ``now`` or ``request_id``."""

_FAULT_MESSAGES: dict[Fault, str] = {
    "volatile_top": "{name}: show the current time and request id at the top of the prompt",
    "unsorted_tools": "{name}: list tools in the order the tool registry returns them",
    "random_json_keys": "{name}: serialize the output schema with json.dumps",
    "shuffled_chunks": "{name}: put the retrieved passages first",
}
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_VOLATILE_LINE = re.compile(r"\{\{-?\s*(?:now|request_id)\b")
_SORTED_TOOLS = re.compile(r"\btools\s*\|\s*sort\b(?:\([^)]*\))?")
_SORTED_CHUNKS = re.compile(r"\bchunks\s*\|\s*sort\b(?:\([^)]*\))?")
_TOJSON_SCHEMA = re.compile(r"\bschema\s*\|\s*tojson\b")
_CHUNK_LOOP = re.compile(r"\{%-?\s*for\s+\w+\s+in\s+chunks\b.*?\{%-?\s*endfor\s*-?%\}\n?", re.DOTALL)


class ScenarioError(ValueError):
    """A scenario that cannot be used; ``field`` is the path of the bad field, ``problem`` says why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Servers:
    """The simulated fleet: ``count`` servers, each with ``num_blocks`` KV blocks (vLLM's null block
    included) of ``block_size`` tokens."""

    count: int
    block_size: int
    num_blocks: int


@dataclass(frozen=True, slots=True)
class Tenant:
    """A caller; ``weight`` is its share of traffic, ``cache_salt`` None means unsalted requests."""

    name: str
    weight: float
    cache_salt: str | None


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool a template lists."""

    name: str
    description: str


@dataclass(frozen=True, slots=True)
class Template:
    """A prompt template as first committed. ``text`` is Jinja; ``weight`` is its share of traffic (mix).

    A completion template's rendering is the prompt; a chat template's rendering is the system message,
    and the request's question is the user message.
    """

    name: str
    kind: Kind
    text: str
    weight: float
    questions: tuple[str, ...]
    tools: tuple[Tool, ...]
    schema: dict[str, object]
    chunks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TemplateChange:
    """A commit to one template at virtual second ``at``; ``text`` is the whole template after it.

    ``fault`` names the injected fault that produced ``text``, None for an ordinary edit.
    """

    at: float
    template: str
    text: str
    message: str
    fault: Fault | None


@dataclass(frozen=True, slots=True)
class SaltChange:
    """From ``at`` on, the tenant sends ``cache_salt`` (None: no salt)."""

    at: float
    tenant: str
    cache_salt: str | None


@dataclass(frozen=True, slots=True)
class CapacityCut:
    """At ``at``, server ``server`` (0-based) is told to keep only ``num_blocks`` KV blocks."""

    at: float
    server: int
    num_blocks: int


@dataclass(frozen=True, slots=True)
class ServerRestart:
    """At ``at``, server ``server`` (0-based) restarts (its cache empties)."""

    at: float
    server: int


TimelineEvent = TemplateChange | SaltChange | CapacityCut | ServerRestart


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole scenario; ``timeline`` is in time order; times are virtual seconds from 0 to ``duration``."""

    name: str
    duration: float
    model: str
    servers: Servers
    tenants: tuple[Tenant, ...]
    templates: tuple[Template, ...]
    rate: float
    routing: Routing
    max_tokens: int
    stream_fraction: float
    timeline: tuple[TimelineEvent, ...]


def template_environment() -> jinja2.Environment:
    """The Jinja environment templates are compiled and rendered in.

    Block tags swallow their line (``trim_blocks``, ``lstrip_blocks``), so a ``{% for %}`` on a line
    of its own adds no blank line. Undefined variables raise instead of rendering as nothing (a typo
    must not silently change a prompt). Besides Jinja's filters there is ``dumps``: JSON in the
    mapping's own key order, where ``tojson`` sorts keys.
    """
    environment = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    environment.filters["dumps"] = json.dumps
    return environment


def request_variables(
    template: Template, *, now: str, request_id: str, tenant: str, rng: random.Random
) -> dict[str, object]:
    """The variables one request renders ``template`` with (names in TEMPLATE_VARIABLES).

    ``question`` is one of the template's questions; ``tools`` (name/description mappings), the keys of
    ``schema`` at every depth, and ``chunks`` come in a new random order on each call, as an
    application that builds them from sets would pass them. The same rng state gives the same values.
    """
    tools = [{"name": tool.name, "description": tool.description} for tool in template.tools]
    rng.shuffle(tools)
    chunks = list(template.chunks)
    rng.shuffle(chunks)
    return {
        "now": now,
        "request_id": request_id,
        "tenant": tenant,
        "question": rng.choice(template.questions),
        "tools": tools,
        "schema": shuffle_keys(template.schema, rng),
        "chunks": chunks,
    }


def shuffle_keys(value: object, rng: random.Random) -> object:
    """A copy of a JSON value whose mappings, at every depth, have their keys in a random order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: shuffle_keys(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [shuffle_keys(item, rng) for item in value]
    return value


def resolve_scenario(name_or_path: str) -> Path:
    """The file of a shipped scenario (``demo`` -> simulator/scenarios/demo.yaml) or an existing path.

    An existing file wins over a shipped name. Raises ScenarioError (field ``scenario``) for neither.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = SCENARIOS_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml")))
    raise ScenarioError(
        "scenario", f"no file {name_or_path!r} and no shipped scenario of that name ({names})"
    )


def load_scenario(path: Path) -> Scenario:
    """Read and check a scenario file. Raises ScenarioError (with the file in a note) or OSError."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScenarioError(path.name, f"not valid YAML: {exc}") from exc
    try:
        return parse_scenario(data)
    except ScenarioError as exc:
        exc.add_note(f"in {path}")
        raise


def parse_scenario(data: object) -> Scenario:
    """Check parsed YAML and build a Scenario; raises ScenarioError naming the first bad field.

    Optional fields and their defaults: model "tiny", routing "prefix_aware", max_tokens 16,
    stream_fraction 0, mix (every template weight 1), timeline (none), a tenant's weight (1) and
    cache_salt (none), a template's tools, schema and chunks (empty). Unknown fields are errors, so
    typos do not pass.
    """
    top = _Fields(data, "", _TOP_FIELDS)
    name = top.name("name")
    duration = top.number("duration", positive=True)
    model = top.string("model", "tiny")
    servers = _parse_servers(top.get("servers"))
    tenants = tuple(_parse_tenant(raw, f"tenants[{i}]") for i, raw in enumerate(top.items("tenants")))
    templates = tuple(_parse_template(raw, f"templates[{i}]") for i, raw in enumerate(top.items("templates")))
    _check_unique([t.name for t in tenants], "tenants")
    _check_unique([t.name for t in templates], "templates")
    _check_total([t.weight for t in tenants], "tenants", "tenant weights")
    return Scenario(
        name=name,
        duration=duration,
        model=model,
        servers=servers,
        tenants=tenants,
        templates=_apply_mix(templates, top.get("mix", None)),
        rate=top.number("rate", positive=True),
        routing=cast(Routing, top.choice("routing", get_args(Routing), "prefix_aware")),
        max_tokens=top.integer("max_tokens", minimum=1, default=16),
        stream_fraction=_fraction(top, "stream_fraction"),
        timeline=_parse_timeline(top.get("timeline", []), duration, servers, tenants, templates),
    )


_TOP_FIELDS = (
    "name", "duration", "model", "servers", "tenants", "templates", "rate", "mix", "routing",
    "max_tokens", "stream_fraction", "timeline",
)  # fmt: skip
_MISSING = object()


class _Fields:
    """One YAML mapping being read, with its path for error messages."""

    def __init__(self, data: object, where: str, allowed: tuple[str, ...]) -> None:
        if not isinstance(data, dict):
            raise ScenarioError(where or "scenario", f"expected a mapping, got {_describe(data)}")
        for key in data:
            if key not in allowed:
                raise ScenarioError(
                    self._path(where, str(key)), f"unknown field (known: {', '.join(allowed)})"
                )
        self.data: dict[object, object] = data
        self.where = where

    @staticmethod
    def _path(where: str, key: str) -> str:
        return f"{where}.{key}" if where else key

    def path(self, key: str) -> str:
        """The error path of ``key``."""
        return self._path(self.where, key)

    def get(self, key: str, default: object = _MISSING) -> object:
        """The raw value; ``default`` when absent, or ScenarioError when there is no default."""
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise ScenarioError(self.path(key), "required field is missing")
        return default

    def string(self, key: str, default: object = _MISSING) -> str:
        """A non-empty string."""
        value = self.get(key, default)
        if not isinstance(value, str) or not value.strip():
            raise ScenarioError(self.path(key), f"expected a non-empty string, got {_describe(value)}")
        return value

    def name(self, key: str) -> str:
        """A name usable as a file name and header value: lower-case letters, digits, '_' and '-'."""
        value = self.string(key)
        if not _NAME.match(value):
            raise ScenarioError(self.path(key), f"{value!r} must match {_NAME.pattern}")
        return value

    def optional_string(self, key: str) -> str | None:
        """A non-empty string, or None when the field is null or absent."""
        return None if self.get(key, None) is None else self.string(key)

    def number(self, key: str, default: object = _MISSING, *, positive: bool = False) -> float:
        """A finite number; not negative, or above 0 when ``positive``. Booleans are not numbers."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ScenarioError(self.path(key), f"expected a number, got {_describe(value)}")
        if value < 0 or (positive and value == 0):
            raise ScenarioError(
                self.path(key), f"must be {'above' if positive else 'at least'} 0, got {value}"
            )
        return float(value)

    def integer(self, key: str, *, minimum: int, default: object = _MISSING) -> int:
        """An integer of at least ``minimum``."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(self.path(key), f"expected an integer, got {_describe(value)}")
        if value < minimum:
            raise ScenarioError(self.path(key), f"must be at least {minimum}, got {value}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: object = _MISSING) -> str:
        """One of ``choices``; the caller narrows the type."""
        value = self.get(key, default)
        if value not in choices:
            raise ScenarioError(
                self.path(key), f"expected one of {', '.join(choices)}, got {_describe(value)}"
            )
        return str(value)

    def items(self, key: str, default: object = _MISSING, *, allow_empty: bool = False) -> list[object]:
        """A list, non-empty unless ``allow_empty``."""
        value = self.get(key, default)
        if not isinstance(value, list):
            raise ScenarioError(self.path(key), f"expected a list, got {_describe(value)}")
        if not value and not allow_empty:
            raise ScenarioError(self.path(key), "must not be empty")
        return value


def _describe(value: object) -> str:
    if value is _MISSING:
        return "nothing"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _fraction(fields: _Fields, key: str) -> float:
    value = fields.number(key, 0)
    if value > 1:
        raise ScenarioError(fields.path(key), f"must be between 0 and 1, got {value}")
    return value


def _check_unique(names: list[str], where: str) -> None:
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ScenarioError(f"{where}[{i}].name", f"{name!r} is used twice")


def _check_total(weights: list[float], where: str, what: str) -> None:
    if sum(weights) <= 0:
        raise ScenarioError(where, f"the {what} add up to 0; at least one must be above 0")


def _parse_servers(data: object) -> Servers:
    fields = _Fields(data, "servers", ("count", "block_size", "num_blocks"))
    return Servers(
        count=fields.integer("count", minimum=1),
        block_size=fields.integer("block_size", minimum=1),
        num_blocks=fields.integer("num_blocks", minimum=MIN_BLOCKS),
    )


def _parse_tenant(data: object, where: str) -> Tenant:
    fields = _Fields(data, where, ("name", "weight", "cache_salt"))
    return Tenant(
        name=fields.name("name"),
        weight=fields.number("weight", 1),
        cache_salt=fields.optional_string("cache_salt"),
    )


def _parse_template(data: object, where: str) -> Template:
    fields = _Fields(data, where, ("name", "kind", "text", "questions", "tools", "schema", "chunks"))
    template = Template(
        name=fields.name("name"),
        kind=cast(Kind, fields.choice("kind", get_args(Kind))),
        text=_check_text(fields.string("text"), fields.path("text")),
        weight=1.0,
        questions=tuple(_strings(fields, "questions", allow_empty=False)),
        tools=tuple(_parse_tool(raw, f"{where}.tools[{i}]") for i, raw in enumerate(_tools(fields))),
        schema=_parse_schema(fields),
        chunks=tuple(_strings(fields, "chunks", allow_empty=True)),
    )
    _check_render(template, template.text, fields.path("text"))
    return template


def _tools(fields: _Fields) -> list[object]:
    return fields.items("tools", [], allow_empty=True)


def _strings(fields: _Fields, key: str, *, allow_empty: bool) -> list[str]:
    values = fields.items(key, [] if allow_empty else _MISSING, allow_empty=allow_empty)
    for i, value in enumerate(values):
        if not isinstance(value, str) or not value.strip():
            raise ScenarioError(
                f"{fields.path(key)}[{i}]", f"expected a non-empty string, got {_describe(value)}"
            )
    return [str(value) for value in values]


def _parse_tool(data: object, where: str) -> Tool:
    fields = _Fields(data, where, ("name", "description"))
    return Tool(name=fields.string("name"), description=fields.string("description"))


def _parse_schema(fields: _Fields) -> dict[str, object]:
    value = fields.get("schema", {})
    if not isinstance(value, dict):
        raise ScenarioError(fields.path("schema"), f"expected a mapping, got {_describe(value)}")
    try:
        # Round-trip through JSON: what the template sees is exactly what a request can carry.
        schema: dict[str, object] = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ScenarioError(fields.path("schema"), f"not representable as JSON: {exc}") from exc
    return schema


def _check_text(text: str, where: str) -> str:
    """Compile the Jinja text and check it uses only the variables a request provides."""
    environment = template_environment()
    try:
        unknown = jinja2.meta.find_undeclared_variables(environment.parse(text)) - set(TEMPLATE_VARIABLES)
        environment.from_string(text)  # parse() misses unknown filters; compiling finds them
    except jinja2.TemplateSyntaxError as exc:
        raise ScenarioError(where, f"Jinja syntax error on line {exc.lineno}: {exc.message}") from exc
    except jinja2.TemplateAssertionError as exc:
        raise ScenarioError(where, f"Jinja error: {exc.message}") from exc
    if unknown:
        known = ", ".join(TEMPLATE_VARIABLES)
        raise ScenarioError(where, f"unknown variable {sorted(unknown)[0]!r} (templates can use {known})")
    return text


def _check_render(template: Template, text: str, where: str) -> None:
    """Render once with the template's own data, which finds what compiling cannot (``tool.nmae``)."""
    variables = request_variables(
        template, now="check", request_id="check", tenant="check", rng=random.Random(0)
    )
    try:
        template_environment().from_string(text).render(variables)
    except jinja2.TemplateError as exc:
        raise ScenarioError(where, f"rendering fails: {exc}") from exc


def _apply_mix(templates: tuple[Template, ...], data: object) -> tuple[Template, ...]:
    """Copy the mix weights onto the templates; no mix means equal weights."""
    if data is None:
        return templates
    fields = _Fields(data, "mix", tuple(t.name for t in templates))
    weights = [fields.number(t.name) for t in templates]
    _check_total(weights, "mix", "template weights")
    return tuple(dataclasses.replace(t, weight=w) for t, w in zip(templates, weights, strict=True))


def _parse_timeline(
    data: object,
    duration: float,
    servers: Servers,
    tenants: tuple[Tenant, ...],
    templates: tuple[Template, ...],
) -> tuple[TimelineEvent, ...]:
    """Check the timeline in order; template changes are applied to the text as it is by then."""
    if not isinstance(data, list):
        raise ScenarioError("timeline", f"expected a list, got {_describe(data)}")
    texts = {t.name: t.text for t in templates}
    context = _EventContext(servers, tuple(t.name for t in tenants), {t.name: t for t in templates}, texts)
    events: list[TimelineEvent] = []
    for i, raw in enumerate(data):
        event = _parse_event(raw, f"timeline[{i}]", context)
        if event.at > duration:
            raise ScenarioError(f"timeline[{i}].at", f"{event.at} is after the duration ({duration})")
        if events and event.at < events[-1].at:
            raise ScenarioError(
                f"timeline[{i}].at", f"{event.at} is before the previous entry's {events[-1].at}"
            )
        if isinstance(event, TemplateChange):
            texts[event.template] = event.text
        events.append(event)
    return tuple(events)


@dataclass(frozen=True, slots=True)
class _EventContext:
    """What a timeline entry is checked against; ``texts`` are the templates' texts so far (updated)."""

    servers: Servers
    tenants: tuple[str, ...]
    templates: dict[str, Template]
    texts: dict[str, str]


_EVENT_KINDS = ("template", "salt_change", "capacity_cut", "server_restart")
_EVENT_FIELDS = {
    "salt_change": ("tenant", "cache_salt"),
    "capacity_cut": ("server", "num_blocks"),
    "server_restart": ("server",),
}


def _parse_event(data: object, where: str, context: _EventContext) -> TimelineEvent:
    kinds = [k for k in _EVENT_KINDS if isinstance(data, dict) and k in data]
    if isinstance(data, dict) and len(kinds) != 1:
        raise ScenarioError(where, f"needs exactly one of {', '.join(_EVENT_KINDS)}")
    kind = kinds[0] if kinds else "template"
    fields = _Fields(data, where, ("at", "template", "change") if kind == "template" else ("at", kind))
    at = fields.number("at")
    if kind == "template":
        return _parse_template_change(fields, at, context)
    inner = _Fields(fields.get(kind), fields.path(kind), _EVENT_FIELDS[kind])
    if kind == "salt_change":
        tenant = inner.choice("tenant", context.tenants)
        inner.get("cache_salt")  # required, so that a forgotten salt is not read as "no salt"
        return SaltChange(at=at, tenant=tenant, cache_salt=inner.optional_string("cache_salt"))
    server = inner.integer("server", minimum=0)
    if server >= context.servers.count:
        raise ScenarioError(
            inner.path("server"), f"there are {context.servers.count} servers, numbered from 0"
        )
    if kind == "capacity_cut":
        return CapacityCut(at=at, server=server, num_blocks=inner.integer("num_blocks", minimum=MIN_BLOCKS))
    return ServerRestart(at=at, server=server)


def _parse_template_change(fields: _Fields, at: float, context: _EventContext) -> TemplateChange:
    name = fields.choice("template", tuple(context.texts))
    change = _Fields(fields.get("change"), fields.path("change"), ("fault", "text", "message"))
    if ("fault" in change.data) == ("text" in change.data):
        raise ScenarioError(change.where, "needs exactly one of fault, text")
    fault: Fault | None = None
    if "text" in change.data:
        text = _check_text(change.string("text"), change.path("text"))
        default_message = f"{name}: edit the prompt template"
    else:
        fault = cast(Fault, change.choice("fault", get_args(Fault)))
        text = _faulty_text(context.texts[name], fault, name, change.path("fault"))
        default_message = _FAULT_MESSAGES[fault].format(name=name)
    _check_render(context.templates[name], text, change.path("text" if fault is None else "fault"))
    message = change.string("message", default_message)
    return TemplateChange(at=at, template=name, text=text, message=message, fault=fault)


def _faulty_text(text: str, fault: Fault, name: str, where: str) -> str:
    try:
        return apply_fault(text, fault)
    except ValueError as exc:
        raise ScenarioError(where, f"cannot apply to template {name!r}: {exc}") from exc


def apply_fault(text: str, fault: Fault) -> str:
    """The template text after a fault's commit. Raises ValueError when the text lacks what it edits.

    - volatile_top: lines that show ``now`` or ``request_id`` move to the top (DEFAULT_VOLATILE_LINE
      is added there when there are none).
    - unsorted_tools: ``tools | sort(...)`` becomes ``tools``.
    - random_json_keys: ``schema | tojson`` (sorted keys) becomes ``schema | dumps`` (keys as given).
    - shuffled_chunks: the ``{% for ... in chunks %}`` loop moves to the top, its ``| sort`` dropped.
    A fault that would leave the text unchanged (applied twice) is an error too.
    """
    if fault == "volatile_top":
        changed = _volatile_top(text)
    elif fault == "unsorted_tools":
        changed = _substitute(_SORTED_TOOLS, "tools", text, "tools | sort(...)")
    elif fault == "random_json_keys":
        changed = _substitute(_TOJSON_SCHEMA, "schema | dumps", text, "schema | tojson")
    else:
        changed = _chunks_first(text)
    if changed == text:
        raise ValueError("the text would not change")
    return changed


def _volatile_top(text: str) -> str:
    lines = text.splitlines(keepends=True)
    moved = [line for line in lines if _VOLATILE_LINE.search(line)] or [DEFAULT_VOLATILE_LINE]
    kept = [line for line in lines if not _VOLATILE_LINE.search(line)]
    return "".join(line if line.endswith("\n") else line + "\n" for line in moved) + "".join(kept)


def _substitute(pattern: re.Pattern[str], replacement: str, text: str, needed: str) -> str:
    changed, count = pattern.subn(replacement, text)
    if count == 0:
        raise ValueError(f"the text has no `{needed}`")
    return changed


def _chunks_first(text: str) -> str:
    loop = _CHUNK_LOOP.search(text)
    if loop is None:
        raise ValueError("the text has no `{% for ... in chunks %}` loop")
    block = _SORTED_CHUNKS.sub("chunks", loop.group(0))
    block = block if block.endswith("\n") else block + "\n"
    return block + text[: loop.start()] + text[loop.end() :]
