"""What vLLM 0.32 accepts of a completion request, and the error it answers otherwise.

The rules and messages follow vLLM 0.32: `VLLMValidationError` (the message ends with the parameter
and value at fault), `OpenAIServing._check_model`, `TokenizeParams` (renderers/params.py) and
`get_max_tokens` (entrypoints/serve/utils/api_utils.py). An error answer is vLLM's `ErrorResponse`:
``{"error": {"message", "type", "param", "code"}}``.
"""

from typing import Any

from app.domain import gpt2


class Refused(Exception):
    """vLLM refuses the request: ``status``, ``message``, and ``param``, the request field at fault."""

    def __init__(self, message: str, *, param: str | None, status: int = 400, kind: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind or ("NotFoundError" if status == 404 else "BadRequestError")

    def answer(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }


def invalid(message: str, param: str, *value: Any) -> Refused:
    """A `VLLMValidationError`: the message names the parameter, and the value when there is one."""
    extras = [f"parameter={param}", *(f"value={v}" for v in value)]
    return Refused(f"{message} ({', '.join(extras)})", param=param)


def cache_salt(body: dict[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise invalid("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    return salt


def served_model(body: dict[str, Any], base: str, adapters: tuple[str, ...]) -> str:
    """The model asked for (the base model when none is named); 404 for one not served."""
    model = body.get("model") or base
    if model not in (base, *adapters):
        message = f"The model `{model}` does not exist. Valid aliases: {base}."
        raise Refused(message, param="model", status=404)
    return str(model)


def prompt_ids(body: dict[str, Any]) -> list[int]:
    """A /v1/completions prompt as token ids: a string to tokenize, or the ids themselves."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    if isinstance(prompt, str):
        return gpt2.encode(prompt)
    raise Refused("prompt: expected a string or a list of token ids", param="prompt")


def chat_prompt_ids(body: dict[str, Any], *, tokenize: bool = False) -> list[int]:
    """The messages of a /v1/chat/completions request (or, `tokenize`, of a chat body to /tokenize),
    rendered with the chat template and tokenized: `gpt2.PARTS_CHAT_TEMPLATE`, which renders the
    request's tools and chat-template arguments (its `reasoning_effort` among them) before the
    messages, as a real server started with `--chat-template` of it does (the tools as sent: vLLM
    re-dumps their outer keys in its own order, which only matters when they come in another).

    As vLLM 0.32 (`ChatCompletionRequest.build_chat_params`), a chat completion's top-level
    `reasoning_effort` is passed to the template over the client's argument, with `enable_thinking`
    = effort != "none" unless the client set it; /tokenize (`TokenizeChatRequest`) has no such field."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Refused("messages: expected a list of messages", param="messages")
    if not messages:
        message = "Cannot apply chat template to an empty conversation. Provide at least one message."
        raise Refused(message, param=None)
    tools, kwargs = body.get("tools"), body.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    if isinstance(effort := body.get("reasoning_effort"), str) and not tokenize:
        kwargs = {"enable_thinking": effort != "none", **kwargs, "reasoning_effort": effort}
    try:
        rendered = gpt2.render_chat_parts(
            messages, tools=tools if isinstance(tools, list) else None, template_kwargs=kwargs,
            add_generation_prompt=body.get("add_generation_prompt", True) is not False,
        )  # fmt: skip
        return gpt2.encode(rendered)
    except ValueError as exc:
        raise Refused(f"messages: {exc}", param="messages") from None


def output_budget(body: dict[str, Any], prompt_tokens: int, max_model_len: int) -> int:
    """The tokens a request may generate: what it asks for, at most what the context leaves after its
    prompt, and all of that when it asks for nothing (vLLM clamps; it refuses only what never fits)."""
    asked = body.get("max_tokens", body.get("max_completion_tokens"))
    if asked is not None and (type(asked) is not int):
        raise Refused("max_tokens: expected an integer", param="max_tokens")
    if asked is not None and asked > max_model_len:
        message = f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}. "
        raise invalid(message + "Please request fewer output tokens.", "max_tokens", asked)
    if prompt_tokens > max_model_len:
        message = (
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt."
        )
        raise invalid(message, "input_tokens", prompt_tokens)
    budget = max_model_len - prompt_tokens if asked is None else min(asked, max_model_len - prompt_tokens)
    if budget < 1:
        raise invalid(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
    return budget
