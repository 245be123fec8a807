"""A scenario's side traffic, apart from the routed fleet: the fields after ``timeline`` in
``simulator/scenarios/demo.yaml``.

- ``side_servers``: servers numbered after the routed ones (``servers.count`` on), which the router
  never picks; each shows an engine's quirk, a lower KV tier or a fault of the collection path and
  gets ``rate`` requests a second of its own (the templates and tenants by the scenario's weights), so
  the routed servers keep the traffic and timeline they had. The collection faults: KV-event batches
  its decoder cannot read (``undecodable_kv_events``, published at a scenario second) and clients that
  call the engine past the gateway (``gateway_bypass_from``).
- ``conversations``: chat requests that change one request part at a time (simulator/part_changes.py),
  sent to one side server through whatever stands in front of it (the gateway).
- ``hosted``: an application's hosted-API usage (simulator/hosted.py), reported to Prefixscope's REST
  ingest and OTLP endpoint as an instrumented application does.

Readers raise ``FieldError``; ``simulator.scenario.parse_scenario`` reports it as a ``ScenarioError``.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.part_changes import PHASES
from simulator.scenario_fields import FieldError, Fields, check_unique, describe


@dataclass(frozen=True, slots=True)
class CpuTierSpec:
    """A CPU offload tier of ``num_blocks`` behind the GPU's; ``reload`` False: its lookups fail, so
    what it holds is recomputed (the ``demoted`` cause)."""

    num_blocks: int
    reload: bool = True


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter a server serves, as vLLM's ``--lora-modules name=path``."""

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class UndecodableEvents:
    """At virtual second ``at``, server number ``server`` publishes ``batches`` KV-event batches on its
    stream whose events a newer engine's shape makes undecodable (simulator/kv_events.py
    ``key_only_removed``), numbered in its sequence as any batch, so that no gap shows."""

    at: float
    server: int
    batches: int


@dataclass(frozen=True, slots=True)
class SideServer:
    """A server outside the router (number ``server``): its own ``rate`` of requests a second, and how
    it differs from the routed ones (None or the default: as they are)."""

    server: int
    rate: float
    num_blocks: int | None = None
    cpu_tier: CpuTierSpec | None = None
    hybrid_block: int | None = None
    hit_counter_wired: bool = True
    prefill_tokens_per_second: float | None = None
    adapters: tuple[Adapter, ...] = ()
    undecodable_events: UndecodableEvents | None = None
    # From this virtual second of the first round on, for the rest of the run (the later rounds
    # too: a misconfigured client stays so), its requests go to the engine itself, past the gateway.
    gateway_bypass_from: float | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """Chat requests to server number ``server`` (a side server: ``side_server`` in the file counts
    the side servers from 0), one every ``every`` seconds from ``start``: the phases
    of simulator/part_changes.py named in ``changes`` (in order, after a first "base" phase),
    ``per_phase`` requests each; ``adapter`` is the LoRA the "adapter" phase switches to."""

    server: int
    template: str
    start: float
    every: float
    per_phase: int
    changes: tuple[str, ...]
    adapter: str | None


@dataclass(frozen=True, slots=True)
class Hosted:
    """``sessions`` sessions of each hosted-API kind (simulator/hosted.py), from virtual second ``start``;
    with ``part_changes``, also the part-change scenario's records, carrying the body each request
    sent (REST) or its content (GenAI spans)."""

    start: float
    sessions: int
    part_changes: bool = False


SIDE_FIELDS = ("side_servers", "conversations", "hosted")

_SIDE_SERVER_FIELDS = (
    "rate", "num_blocks", "cpu_tier", "hybrid_block", "hit_counter", "prefill_tokens_per_second", "adapters",
    "undecodable_kv_events", "gateway_bypass_from",
)  # fmt: skip


def parse_side_servers(data: object, *, first: int, block_size: int) -> tuple[SideServer, ...]:
    """The ``side_servers`` list; the first is server number ``first`` (the routed servers' count)."""
    if not isinstance(data, list):
        raise FieldError("side_servers", f"expected a list, got {describe(data)}")
    return tuple(
        _parse_side_server(item, f"side_servers[{i}]", first + i, block_size=block_size)
        for i, item in enumerate(data)
    )


def _parse_side_server(data: object, where: str, server: int, *, block_size: int) -> SideServer:
    fields = Fields(data, where, _SIDE_SERVER_FIELDS)
    hybrid = None
    if fields.get("hybrid_block", None) is not None:
        hybrid = fields.integer("hybrid_block", minimum=block_size)
        if hybrid % block_size:
            raise FieldError(fields.path("hybrid_block"), f"must be a multiple of block_size {block_size}")
    prefill, bypass = "prefill_tokens_per_second", "gateway_bypass_from"
    return SideServer(
        server=server,
        rate=fields.number("rate", 0),
        num_blocks=fields.integer("num_blocks", minimum=2) if "num_blocks" in fields.data else None,
        cpu_tier=_parse_cpu_tier(fields.get("cpu_tier", None), fields.path("cpu_tier")),
        hybrid_block=hybrid,
        hit_counter_wired=fields.choice("hit_counter", ("wired", "not_wired"), "wired") == "wired",
        prefill_tokens_per_second=fields.number(prefill, positive=True) if prefill in fields.data else None,
        adapters=_parse_adapters(fields),
        undecodable_events=_parse_undecodable(fields, server),
        gateway_bypass_from=fields.number(bypass) if bypass in fields.data else None,
    )


def _parse_undecodable(outer: Fields, server: int) -> UndecodableEvents | None:
    data = outer.get("undecodable_kv_events", None)
    if data is None:
        return None
    fields = Fields(data, outer.path("undecodable_kv_events"), ("at", "batches"))
    return UndecodableEvents(
        at=fields.number("at"), server=server, batches=fields.integer("batches", minimum=1)
    )


def _parse_cpu_tier(data: object, where: str) -> CpuTierSpec | None:
    if data is None:
        return None
    fields = Fields(data, where, ("num_blocks", "reload"))
    reload = fields.get("reload", True)
    if not isinstance(reload, bool):
        raise FieldError(fields.path("reload"), f"expected true or false, got {describe(reload)}")
    return CpuTierSpec(fields.integer("num_blocks", minimum=1), reload)


def _parse_adapters(fields: Fields) -> tuple[Adapter, ...]:
    adapters = []
    for i, item in enumerate(fields.items("adapters", [], allow_empty=True)):
        inner = Fields(item, f"{fields.path('adapters')}[{i}]", ("name", "path"))
        adapters.append(Adapter(inner.string("name"), inner.string("path")))
    check_unique([a.name for a in adapters], fields.path("adapters"))
    return tuple(adapters)


def parse_conversations(data: object, sides: tuple[SideServer, ...]) -> tuple[Conversation, ...]:
    """The ``conversations`` list; each goes to a side server, whose adapters hold its ``adapter``."""
    if not isinstance(data, list):
        raise FieldError("conversations", f"expected a list, got {describe(data)}")
    return tuple(_parse_conversation(item, f"conversations[{i}]", sides) for i, item in enumerate(data))


def _parse_conversation(data: object, where: str, sides: tuple[SideServer, ...]) -> Conversation:
    fields = Fields(
        data, where, ("side_server", "template", "start", "every", "per_phase", "changes", "adapter")
    )
    position = fields.integer("side_server", minimum=0)
    if position >= len(sides):
        raise FieldError(fields.path("side_server"), f"there are {len(sides)} side servers, numbered from 0")
    side = sides[position]
    changes = fields.strings("changes", allow_empty=False)
    for i, change in enumerate(changes):
        if change not in PHASES[1:]:
            raise FieldError(f"{fields.path('changes')}[{i}]", f"expected one of {', '.join(PHASES[1:])}")
    adapter = fields.optional_string("adapter")
    served = [a.name for a in side.adapters]
    if ("adapter" in changes) != (adapter is not None) or (adapter is not None and adapter not in served):
        raise FieldError(fields.path("adapter"), f"the adapter phase needs one the server serves ({served})")
    return Conversation(
        server=side.server,
        template=fields.name("template"),
        start=fields.number("start", 0),
        every=fields.number("every", positive=True),
        per_phase=fields.integer("per_phase", minimum=1),
        changes=tuple(changes),
        adapter=adapter,
    )


def parse_hosted(data: object) -> Hosted | None:
    """The ``hosted`` mapping; None when absent."""
    if data is None:
        return None
    fields = Fields(data, "hosted", ("start", "sessions", "part_changes"))
    part_changes = fields.get("part_changes", False)
    if not isinstance(part_changes, bool):
        raise FieldError(fields.path("part_changes"), f"expected true or false, got {describe(part_changes)}")
    return Hosted(
        start=fields.number("start", 0),
        sessions=fields.integer("sessions", minimum=1, default=1),
        part_changes=part_changes,
    )
