"""The fleet CLI: its servers come from a scenario, or from its flags."""

import pytest

from simulator.fleet import configs_from_args, parse_args


def test_a_scenario_gives_the_fleet_its_servers() -> None:
    configs = configs_from_args(parse_args(["--scenario", "vllm-cpu", "--base-port", "9000"]))
    assert [(c.name, c.http_port, c.model, c.block_size, c.num_blocks) for c in configs] == [
        ("sim-0", 9000, "tiny", 32, 48)
    ]


def test_without_a_scenario_the_flags_and_defaults_apply() -> None:
    configs = configs_from_args(parse_args(["--block-size", "16"]))
    assert [(c.name, c.block_size, c.num_blocks) for c in configs][-1] == ("sim-3", 16, 48)


@pytest.mark.parametrize(
    "flag", [["--servers", "2"], ["--block-size", "32"], ["--num-blocks", "9"], ["--model", "x"]]
)
def test_a_scenario_and_a_flag_that_contradicts_it_are_refused(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--scenario", "demo", *flag])
    assert f"leave out {flag[0]}" in capsys.readouterr().err
