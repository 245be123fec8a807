"""Run a fleet of simulated vLLM servers in one process, each on its own ports.

    python -m simulator.fleet --servers 4 --base-port 8101     # prints the servers as JSON lines
    python -m simulator.fleet --scenario demo --base-port 8101 # the servers the demo scenario describes

Server i listens for HTTP on base-port + i, publishes KV events on kv-base-port + i and answers
replays on replay-base-port + i. SIGINT or SIGTERM stops it.
"""

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Iterable
from dataclasses import replace

import zmq.asyncio

from app.domain.blockhash import LoraKey
from simulator.scenario import Quirk, ScenarioError, load_scenario, resolve_scenario
from simulator.scenario_side import SideServer
from simulator.server import ServerConfig, SimulatedServer

logger = logging.getLogger(__name__)


def fleet_configs(
    count: int, *, base_port: int, kv_base_port: int, replay_base_port: int, template: ServerConfig
) -> list[ServerConfig]:
    """`count` servers named sim-0, sim-1, ... on consecutive ports, otherwise like `template`."""
    return [
        replace(
            template,
            name=f"sim-{i}",
            http_port=base_port + i,
            kv_port=kv_base_port + i,
            replay_port=replay_base_port + i,
            seed=template.seed + i,
        )
        for i in range(count)
    ]


def describe(config: ServerConfig) -> dict[str, object]:
    """What Prefixscope needs to register a server: its URLs, endpoints and topic."""
    return {
        "name": config.name,
        "base_url": config.base_url,
        "metrics_url": f"{config.base_url}/metrics",
        "kv_events_endpoint": f"tcp://{config.host}:{config.kv_port}",
        "kv_replay_endpoint": f"tcp://{config.host}:{config.replay_port}",
        "kv_topic": config.topic,
        "model": config.model,
    }


async def serve(configs: list[ServerConfig], stop: asyncio.Event) -> None:
    """Start every server, announce them on stdout, and run until `stop` is set."""
    context = zmq.asyncio.Context()
    servers = [SimulatedServer(config, context) for config in configs]
    try:
        for server in servers:
            await server.start()
            print(json.dumps(describe(server.config)), flush=True)  # noqa: T201 - the CLI's output
        await stop.wait()
    finally:
        for server in servers:
            await server.stop()
        context.term()


# What a scenario's `servers` and `model` say, and the flags that say it otherwise.
SCENARIO_FLAGS = ("servers", "model", "block_size", "num_blocks")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The CLI's arguments. With --scenario, the number of servers, their model, block size and
    KV blocks are the scenario's (the load generator running it reads the same file), and giving
    them as flags too is an error; without, the flags or ServerConfig's defaults (4 servers)."""
    parser = argparse.ArgumentParser(prog="python -m simulator.fleet", description=__doc__.splitlines()[0])
    defaults = ServerConfig()
    parser.add_argument(
        "--scenario", default=None, help="a shipped scenario name (demo) or a YAML file whose servers to run"
    )
    parser.add_argument("--servers", type=int, default=None, help="default 4")
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--base-port", type=int, default=8101)
    parser.add_argument("--kv-base-port", type=int, default=5601)
    parser.add_argument("--replay-base-port", type=int, default=5701)
    parser.add_argument("--model", default=None, help=f"default {defaults.model}")
    parser.add_argument("--block-size", type=int, default=None, help=f"default {defaults.block_size}")
    parser.add_argument("--num-blocks", type=int, default=None, help=f"default {defaults.num_blocks}")
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    parser.add_argument("--prefill-tokens-per-second", type=float, default=defaults.prefill_tokens_per_second)
    parser.add_argument(
        "--no-sleep", action="store_true", help="answer at once instead of waiting out the modelled latency"
    )
    parser.add_argument("--array-form-events", action="store_true", help="legacy array-form KV events")
    parser.add_argument(
        "--otlp-endpoint", default=None, help="where llm_request spans go (OTLP/HTTP traces URL)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lora-modules", nargs="+", type=lora_module, default=[], metavar="NAME=PATH",
        help="LoRA adapters to serve, as vLLM's --lora-modules (the path is named, never read)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    given = [f"--{name.replace('_', '-')}" for name in SCENARIO_FLAGS if getattr(args, name) is not None]
    if args.scenario is None:
        shape = (4, defaults.model, defaults.block_size, defaults.num_blocks)
    elif given:
        parser.error(f"--scenario says how many servers and of what shape: leave out {', '.join(given)}")
    else:
        try:
            scenario = load_scenario(resolve_scenario(args.scenario))
        except (ScenarioError, OSError) as exc:
            parser.error(str(exc))
        servers = scenario.servers
        shape = (scenario.server_count, scenario.model, servers.block_size, servers.num_blocks)
        args.quirks = servers.quirks
        args.sides = scenario.side_servers
    for name, default in zip(SCENARIO_FLAGS, shape, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def lora_module(text: str) -> LoraKey:
    """One ``name=path`` of ``--lora-modules``, split at the first ``=`` as vLLM does."""
    name, equals, path = text.partition("=")
    if not (name and equals and path):
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return LoraKey(name, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_run(configs_from_args(args)))


def configs_from_args(args: argparse.Namespace) -> list[ServerConfig]:
    """The servers the CLI's arguments (parse_args) describe."""
    template = ServerConfig(
        host=args.host,
        model=args.model,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_model_len=args.max_model_len,
        prefill_tokens_per_second=args.prefill_tokens_per_second,
        sleep=not args.no_sleep,
        array_form_events=args.array_form_events,
        otlp_endpoint=args.otlp_endpoint,
        seed=args.seed,
        lora_adapters=tuple(args.lora_modules),
    )
    configs = fleet_configs(
        args.servers,
        base_port=args.base_port,
        kv_base_port=args.kv_base_port,
        replay_base_port=args.replay_base_port,
        template=template,
    )
    return with_sides(with_quirks(configs, getattr(args, "quirks", ())), getattr(args, "sides", ()))


def with_quirks(configs: list[ServerConfig], quirks: Iterable[Quirk]) -> list[ServerConfig]:
    """The servers, each made as its scenario quirk says (numbered from 0 in `configs`' order)."""
    by_server = {quirk.server: quirk for quirk in quirks}
    return [
        replace(config, hybrid_block=quirk.hybrid_block, speculative=quirk.speculative,
                hit_counter_wired=quirk.hit_counter_wired)
        if (quirk := by_server.get(index)) else config
        for index, config in enumerate(configs)
    ]  # fmt: skip


def with_sides(configs: list[ServerConfig], sides: Iterable[SideServer]) -> list[ServerConfig]:
    """The servers, each side server (simulator/scenario_side.py) made as its scenario says."""
    made = list(configs)
    for side in sides:
        config = made[side.server]
        tier = side.cpu_tier
        made[side.server] = replace(
            config,
            num_blocks=side.num_blocks or config.num_blocks,
            cpu_blocks=tier.num_blocks if tier else 0,
            cpu_reload=tier.reload if tier else True,
            hybrid_block=side.hybrid_block,
            hit_counter_wired=side.hit_counter_wired,
            prefill_tokens_per_second=side.prefill_tokens_per_second or config.prefill_tokens_per_second,
            lora_adapters=(*config.lora_adapters, *(LoraKey(a.name, a.path) for a in side.adapters)),
        )
    return made


async def _run(configs: list[ServerConfig]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await serve(configs, stop)


if __name__ == "__main__":
    main()
