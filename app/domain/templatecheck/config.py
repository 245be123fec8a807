"""The file a template repository describes its templates in: ``prefixscope.yaml`` at its root.

Parsed and validated here (pydantic, unknown keys refused so that a typo is an error, not a setting
silently ignored); docs/template-check.md documents it. Pure: the caller reads the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CONFIG_FILE = "prefixscope.yaml"
BUNDLED_TOKENIZER = "gpt2"
"""The tokenizer name that means the bundled GPT-2 byte-level BPE (app/domain/gpt2.py)."""


class ConfigError(ValueError):
    """The describing file is missing, not YAML, or not valid; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JinjaOptions(_Strict):
    """The Jinja environment's whitespace options, as the application's builder sets them."""

    trim_blocks: bool = False
    lstrip_blocks: bool = False
    keep_trailing_newline: bool = False


Variable = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class TemplateEntry(_Strict):
    """The templates one ``files`` pattern matches, and how to render and judge them."""

    files: list[str] = Field(min_length=1)
    name: str = "{stem}"
    kind: Literal["completion", "chat"] = "completion"
    user: Variable | None = None
    marker: str | None = Field(default=None, min_length=1)
    per_request: list[Variable] = []
    per_user: list[Variable] = []
    unordered: list[Variable] = []
    ordered: list[Variable] = []
    samples: list[dict[str, Any]] = Field(min_length=1)
    command: list[str] | None = Field(default=None, min_length=1)
    golden: str | None = None

    @field_validator("files", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> TemplateEntry:
        varying = [*self.per_request, *self.per_user]
        for name in varying:
            values = {repr(sample.get(name)) for sample in self.samples}
            if len(values) < 2:
                raise ValueError(
                    f"`{name}` changes per request, but the samples give it one value: give two samples "
                    "that differ in it, so that the check sees where it varies"
                )
        if self.user is not None and self.kind != "chat":
            raise ValueError("`user` names the user message of a chat template: set `kind: chat`")
        if self.golden is not None and PurePosixPath(self.golden).is_absolute():
            raise ValueError("`golden` is a path inside the repository, not an absolute one")
        return self


class ConfigModel(_Strict):
    version: Literal[1]
    tokenizer: str = BUNDLED_TOKENIZER
    block_size: int = Field(gt=0, le=65536)
    jinja: JinjaOptions = JinjaOptions()
    templates: list[TemplateEntry] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class CheckConfig:
    """A validated describing file: the tokenizer (``gpt2`` or a path in the repository to a
    tokenizer.json or a model folder), the served block size, the Jinja options and the entries."""

    tokenizer: str
    block_size: int
    jinja: JinjaOptions
    templates: tuple[TemplateEntry, ...]


def parse_config(text: str, *, path: str = CONFIG_FILE) -> CheckConfig:
    """The describing file's settings. Raises ConfigError naming the file, the key and the problem."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: expected a mapping with `version`, `block_size` and `templates`")
    try:
        model = ConfigModel.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: " + "; ".join(_problem(error) for error in exc.errors())) from None
    return CheckConfig(model.tokenizer, model.block_size, model.jinja, tuple(model.templates))


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(top)"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"


def template_name(entry: TemplateEntry, path: str) -> str:
    """The product's name of the template in file ``path``: the entry's ``name`` with ``{stem}``
    (the file name without its suffix) and ``{path}`` filled in."""
    return entry.name.replace("{stem}", PurePosixPath(path).stem).replace("{path}", path)
