"""The answer of a vLLM server's ``/v1/models``: the base models and LoRA adapters it serves. No I/O.

vLLM 0.32 (``vllm/entrypoints/openai/models/serving.py``, ``show_available_models``) lists one card
per served name of the base model (``parent`` null, ``root`` the model's path), then one per loaded
LoRA adapter: ``id`` the adapter's name, ``root`` its ``lora_request.path`` (what ``--lora-modules
name=path`` or ``/v1/load_lora_adapter`` gave, verbatim) and ``parent`` its base model's name. That
path is the one vLLM hashes into every block of the adapter's requests.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ModelsParseError(ValueError):
    """The answer is not a model list."""


@dataclass(frozen=True, slots=True)
class ServedModels:
    """What a server serves: its base model's names, and its LoRA adapters as {name: path}."""

    base_models: tuple[str, ...]
    lora_adapters: Mapping[str, str]


def parse_models(text: str | bytes) -> ServedModels:
    """The models of a ``/v1/models`` answer, in the answer's order.

    A card with a ``parent`` is a LoRA adapter; one whose ``root`` is not a non-empty string is
    left out (its blocks cannot be hashed without the path). Raises ModelsParseError when the
    answer is not JSON, has no ``data`` list, or a card has no string ``id``.
    """
    try:
        answer = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelsParseError(f"not JSON: {exc}") from None
    cards = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(cards, list):
        raise ModelsParseError("not a model list: no `data` list")
    base_models: list[str] = []
    adapters: dict[str, str] = {}
    for card in cards:
        name = _card_id(card)
        if card.get("parent") is None:
            base_models.append(name)
        elif isinstance(root := card.get("root"), str) and root:
            adapters[name] = root
    return ServedModels(base_models=tuple(base_models), lora_adapters=adapters)


def _card_id(card: Any) -> str:
    if not isinstance(card, dict) or not isinstance(card.get("id"), str):
        raise ModelsParseError("a model card has no string `id`")
    name: str = card["id"]
    return name
