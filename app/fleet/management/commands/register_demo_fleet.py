"""Register the simulated demo fleet (python -m simulator.fleet) as Prefixscope servers."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from app.fleet.services import register_server
from simulator.fleet import describe, fleet_configs
from simulator.server import ServerConfig


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--servers", type=int, default=4)
        parser.add_argument("--base-port", type=int, default=8101)
        parser.add_argument("--kv-base-port", type=int, default=5601)
        parser.add_argument("--replay-base-port", type=int, default=5701)

    def handle(
        self, *args: Any, servers: int, base_port: int, kv_base_port: int, replay_base_port: int, **_: Any
    ) -> None:
        configs = fleet_configs(
            servers, base_port=base_port, kv_base_port=kv_base_port, replay_base_port=replay_base_port,
            template=ServerConfig(),
        )  # fmt: skip
        for config in configs:
            register_server(**{k: str(v) for k, v in describe(config).items()})
        self.stdout.write(f"registered {len(configs)} simulated servers")
