"""The simulator tokenizes and renders chats as the real vLLM server with the tiny model did."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.gpt2 import CHAT_TEMPLATE, decode, encode, render_chat, token_strs, vocab_size
from tests.support.captures import VLLM_CPU_FIXTURES, load_json

COMPLETIONS = [
    path.name
    for path in sorted(VLLM_CPU_FIXTURES.glob("completion-*.json"))
    if "response" in load_json(path.name)
]


def _choice(name: str) -> tuple[str, dict[str, Any]]:
    capture = load_json(name)
    return capture["request"]["prompt"], capture["response"]["choices"][0]


def test_every_captured_completion_is_covered() -> None:
    assert len(COMPLETIONS) == 16


@pytest.mark.parametrize("name", COMPLETIONS)
def test_a_prompt_encodes_to_the_servers_prompt_token_ids(name: str) -> None:
    prompt, choice = _choice(name)
    assert encode(prompt) == choice["prompt_token_ids"]


@pytest.mark.parametrize("name", COMPLETIONS)
def test_ids_decode_to_the_servers_prompt_and_completion_text(name: str) -> None:
    prompt, choice = _choice(name)
    assert decode(choice["prompt_token_ids"]) == prompt
    assert decode(choice["token_ids"]) == choice["text"]


def test_tokenize_answer_has_the_same_ids_and_token_strings() -> None:
    answer = load_json("tokenize-prompt.json")
    prompt, _ = _choice("completion-salt-a-1.json")  # the same text, unsalted
    assert encode(prompt) == answer["tokens"]
    assert token_strs(answer["tokens"]) == answer["token_strs"]
    assert answer["count"] == len(answer["tokens"])


def test_short_tokenize_and_detokenize_answers_round_trip() -> None:
    short, detok = load_json("tokenize-short.json"), load_json("detokenize.json")
    assert decode(short["tokens"]) == detok["response"]["prompt"]
    assert encode(detok["response"]["prompt"]) == detok["request"]["tokens"] == short["tokens"]


def test_the_end_of_text_marker_is_one_special_token() -> None:
    assert vocab_size() == 50257
    assert encode("a<|endoftext|>b") == [64, 50256, 65]
    assert decode([50256]) == "<|endoftext|>"
    assert encode("") == []


def test_an_id_outside_the_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decode([50257])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_strs([-1])


def test_a_chat_renders_as_chatml_with_a_generation_prompt() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]
    assert render_chat(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi\nthere<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat(messages, add_generation_prompt=False).endswith("Hi\nthere<|im_end|>\n")
    assert render_chat([]) == "<|im_start|>assistant\n"


def test_a_rendered_chat_shares_its_system_prefix_tokens() -> None:
    system = {"role": "system", "content": "You are the support assistant. " * 8}
    first = encode(render_chat([system, {"role": "user", "content": "reset?"}]))
    second = encode(render_chat([system, {"role": "user", "content": "update?"}]))
    shared = encode(render_chat([system], add_generation_prompt=False))
    assert first[: len(shared)] == second[: len(shared)] == shared


def test_template_markers_tokenize_as_plain_text() -> None:
    # GPT-2 has no ChatML tokens: the marker is seven ordinary tokens, as in the real server.
    assert token_strs(encode("<|im_start|>")) == ["<", "|", "im", "_", "start", "|", ">"]
    assert "<|im_start|>" in CHAT_TEMPLATE


@pytest.mark.parametrize("message", [{"role": "user"}, {"role": "user", "content": ["a"]}, {"content": "x"}])
def test_a_message_without_string_role_and_content_is_refused(message: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="string 'role'"):
        render_chat([message])
