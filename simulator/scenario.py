"""Scenarios for the simulated fleet: the YAML format, its dataclasses and its loader.

A scenario says how many servers there are, which tenants and prompt templates send traffic, at what
rate, how requests are routed, and what changes at which virtual second: template commits (ordinary
edits or injected cache-killing faults), tenant salt changes, capacity cuts, server restarts and
routing changes (the router's policy switched).
``simulator/scenarios/demo.yaml`` shows every field. Every loader error is a ``ScenarioError`` whose
``field`` is the path of the bad field, e.g. ``tenants[1].weight`` or ``timeline[0].change.fault``.

Templates are Jinja; ``simulator.template_rendering`` says which variables a request gives them, and
``simulator.template_faults`` what each fault edits.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

import jinja2
import jinja2.meta
import yaml

from simulator.scenario_fields import FieldError, Fields, check_total, check_unique, describe
from simulator.scenario_side import (
    SIDE_FIELDS,
    Conversation,
    Hosted,
    SideServer,
    parse_conversations,
    parse_hosted,
    parse_side_servers,
)
from simulator.template_faults import FAULT_MESSAGES, Fault, apply_fault
from simulator.template_rendering import TEMPLATE_VARIABLES, request_variables, template_environment

Kind = Literal["completion", "chat"]
Routing = Literal["random", "round_robin", "prefix_aware"]

SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"
MIN_BLOCKS = 2
"""num_blocks counts vLLM's null block (as --num-gpu-blocks-override does), so 2 is the least that caches."""


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
    quirks: tuple[Quirk, ...] = ()

    def quirk(self, server: int) -> Quirk | None:
        """What server `server` (numbered from 0) does differently from a plain vLLM; None: nothing."""
        return next((quirk for quirk in self.quirks if quirk.server == server), None)


@dataclass(frozen=True, slots=True)
class Quirk:
    """One server that is not a plain vLLM: a hybrid model whose hits align to a Mamba group's
    ``hybrid_block`` tokens, speculative decoding by EAGLE (``speculative``: the last matched block is
    dropped), a hit counter that is not wired (``hit_counter_wired`` False: usage and counters say 0
    cached tokens while TTFT shows the reuse)."""

    server: int
    hybrid_block: int | None = None
    speculative: bool = False
    hit_counter_wired: bool = True


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


@dataclass(frozen=True, slots=True)
class RoutingChange:
    """From ``at`` on, the router chooses servers by ``routing`` (say, round_robin where it was
    prefix_aware: a template's requests no longer land on the server holding their prefix)."""

    at: float
    routing: Routing


TimelineEvent = TemplateChange | SaltChange | CapacityCut | ServerRestart | RoutingChange


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
    side_servers: tuple[SideServer, ...] = ()
    conversations: tuple[Conversation, ...] = ()
    hosted: Hosted | None = None

    @property
    def server_count(self) -> int:
        """The routed servers and the side servers after them."""
        return self.servers.count + len(self.side_servers)


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
    cache_salt (none), a template's tools, schema and chunks (empty), side_servers and conversations
    (none), hosted (none; simulator/scenario_side.py). Unknown fields are errors, so typos do not pass.
    """
    try:
        return _parse_scenario(data)
    except FieldError as exc:  # the field reader cannot raise ScenarioError: this module imports it
        raise ScenarioError(exc.field, exc.problem) from exc.__cause__  # e.g. the JSON error; often None


def _parse_scenario(data: object) -> Scenario:
    top = Fields(data, "", _TOP_FIELDS)
    name = top.name("name")
    duration = top.number("duration", positive=True)
    model = top.string("model", "tiny")
    servers = _parse_servers(top.get("servers"))
    tenants = tuple(_parse_tenant(raw, f"tenants[{i}]") for i, raw in enumerate(top.items("tenants")))
    templates = tuple(_parse_template(raw, f"templates[{i}]") for i, raw in enumerate(top.items("templates")))
    check_unique([t.name for t in tenants], "tenants")
    check_unique([t.name for t in templates], "templates")
    check_total([t.weight for t in tenants], "tenants", "tenant weights")
    sides = parse_side_servers(
        top.get("side_servers", []), first=servers.count, block_size=servers.block_size
    )
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
        stream_fraction=top.fraction("stream_fraction", 0),
        timeline=_parse_timeline(top.get("timeline", []), duration, servers, tenants, templates),
        side_servers=sides,
        conversations=parse_conversations(top.get("conversations", []), sides),
        hosted=parse_hosted(top.get("hosted", None)),
    )


_TOP_FIELDS = (
    "name", "duration", "model", "servers", "tenants", "templates", "rate", "mix", "routing",
    "max_tokens", "stream_fraction", "timeline", *SIDE_FIELDS,
)  # fmt: skip


def _parse_servers(data: object) -> Servers:
    fields = Fields(data, "servers", ("count", "block_size", "num_blocks", "quirks"))
    count, block_size = fields.integer("count", minimum=1), fields.integer("block_size", minimum=1)
    quirks = tuple(
        _parse_quirk(item, f"servers.quirks[{index}]", count, block_size)
        for index, item in enumerate(fields.items("quirks", [], allow_empty=True))
    )
    check_unique([str(quirk.server) for quirk in quirks], "servers.quirks")
    return Servers(count, block_size, fields.integer("num_blocks", minimum=MIN_BLOCKS), quirks)


def _parse_quirk(data: object, where: str, count: int, block_size: int) -> Quirk:
    fields = Fields(data, where, ("server", "hybrid_block", "speculative", "hit_counter"))
    server = fields.integer("server", minimum=0)
    if server >= count:
        raise ScenarioError(fields.path("server"), f"there are {count} servers, numbered from 0")
    hybrid = None
    if fields.get("hybrid_block", None) is not None:
        hybrid = fields.integer("hybrid_block", minimum=block_size)
        if hybrid % block_size:
            raise ScenarioError(fields.path("hybrid_block"), f"must be a multiple of block_size {block_size}")
    speculative = fields.get("speculative", False)
    if not isinstance(speculative, bool):
        raise ScenarioError(
            fields.path("speculative"), f"expected true or false, got {describe(speculative)}"
        )
    return Quirk(
        server=server,
        hybrid_block=hybrid,
        speculative=speculative,
        hit_counter_wired=fields.choice("hit_counter", ("wired", "not_wired"), "wired") == "wired",
    )


def _parse_tenant(data: object, where: str) -> Tenant:
    fields = Fields(data, where, ("name", "weight", "cache_salt"))
    return Tenant(
        name=fields.name("name"),
        weight=fields.number("weight", 1),
        cache_salt=fields.optional_string("cache_salt"),
    )


def _parse_template(data: object, where: str) -> Template:
    fields = Fields(data, where, ("name", "kind", "text", "questions", "tools", "schema", "chunks"))
    template = Template(
        name=fields.name("name"),
        kind=cast(Kind, fields.choice("kind", get_args(Kind))),
        text=_check_text(fields.string("text"), fields.path("text")),
        weight=1.0,
        questions=tuple(fields.strings("questions", allow_empty=False)),
        tools=tuple(
            _parse_tool(raw, f"{where}.tools[{i}]")
            for i, raw in enumerate(fields.items("tools", [], allow_empty=True))
        ),
        schema=fields.json_mapping("schema", {}),
        chunks=tuple(fields.strings("chunks", allow_empty=True)),
    )
    _check_render(template, template.text, fields.path("text"))
    return template


def _parse_tool(data: object, where: str) -> Tool:
    fields = Fields(data, where, ("name", "description"))
    return Tool(name=fields.string("name"), description=fields.string("description"))


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
    fields = Fields(data, "mix", tuple(t.name for t in templates))
    weights = [fields.number(t.name) for t in templates]
    check_total(weights, "mix", "template weights")
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
        raise ScenarioError("timeline", f"expected a list, got {describe(data)}")
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


_EVENT_KINDS = ("template", "salt_change", "capacity_cut", "server_restart", "routing_change")
_EVENT_FIELDS = {
    "routing_change": ("routing",),
    "salt_change": ("tenant", "cache_salt"),
    "capacity_cut": ("server", "num_blocks"),
    "server_restart": ("server",),
}


def _parse_event(data: object, where: str, context: _EventContext) -> TimelineEvent:
    kinds = [k for k in _EVENT_KINDS if isinstance(data, dict) and k in data]
    if isinstance(data, dict) and len(kinds) != 1:
        raise ScenarioError(where, f"needs exactly one of {', '.join(_EVENT_KINDS)}")
    kind = kinds[0] if kinds else "template"
    fields = Fields(data, where, ("at", "template", "change") if kind == "template" else ("at", kind))
    at = fields.number("at")
    if kind == "template":
        return _parse_template_change(fields, at, context)
    inner = Fields(fields.get(kind), fields.path(kind), _EVENT_FIELDS[kind])
    if kind == "salt_change":
        tenant = inner.choice("tenant", context.tenants)
        inner.get("cache_salt")  # required, so that a forgotten salt is not read as "no salt"
        return SaltChange(at=at, tenant=tenant, cache_salt=inner.optional_string("cache_salt"))
    if kind == "routing_change":
        return RoutingChange(at=at, routing=cast(Routing, inner.choice("routing", get_args(Routing))))
    server = inner.integer("server", minimum=0)
    if server >= context.servers.count:
        raise ScenarioError(
            inner.path("server"), f"there are {context.servers.count} servers, numbered from 0"
        )
    if kind == "capacity_cut":
        return CapacityCut(at=at, server=server, num_blocks=inner.integer("num_blocks", minimum=MIN_BLOCKS))
    return ServerRestart(at=at, server=server)


def _parse_template_change(fields: Fields, at: float, context: _EventContext) -> TemplateChange:
    name = fields.choice("template", tuple(context.texts))
    change = Fields(fields.get("change"), fields.path("change"), ("fault", "text", "message"))
    if ("fault" in change.data) == ("text" in change.data):
        raise ScenarioError(change.where, "needs exactly one of fault, text")
    fault: Fault | None = None
    if "text" in change.data:
        text = _check_text(change.string("text"), change.path("text"))
        default_message = f"{name}: edit the prompt template"
    else:
        fault = cast(Fault, change.choice("fault", get_args(Fault)))
        text = _faulty_text(context.texts[name], fault, name, change.path("fault"))
        default_message = FAULT_MESSAGES[fault].format(name=name)
    _check_render(context.templates[name], text, change.path("text" if fault is None else "fault"))
    message = change.string("message", default_message)
    return TemplateChange(at=at, template=name, text=text, message=message, fault=fault)


def _faulty_text(text: str, fault: Fault, name: str, where: str) -> str:
    try:
        return apply_fault(text, fault)
    except ValueError as exc:
        raise ScenarioError(where, f"cannot apply to template {name!r}: {exc}") from exc
