"""The injected template faults: commits that undo what keeps a template's prompts cache-friendly.

A scenario's timeline commits one with ``change: {fault: <name>}``. Each is a plain text edit of the
template as it is by then (``apply_fault``), so the regression shows in the template's git history
as it would in a real repository:

- volatile_top: the current time and request id move to the top of the prompt;
- unsorted_tools: the tools are listed in the order the application passes them;
- random_json_keys: the output schema is serialized in its own key order;
- shuffled_chunks: the retrieved passages come first, in the order they are passed.
"""

from __future__ import annotations

import re
from typing import Literal

Fault = Literal["volatile_top", "unsorted_tools", "random_json_keys", "shuffled_chunks"]

DEFAULT_VOLATILE_LINE = "Current time: {{ now }} | Request ID: {{ request_id }}"
"""What ``volatile_top`` puts at the top when the template has no line with ``now`` or ``request_id``."""
FAULT_MESSAGES: dict[Fault, str] = {
    "volatile_top": "{name}: show the current time and request id at the top of the prompt",
    "unsorted_tools": "{name}: list tools in the order the tool registry returns them",
    "random_json_keys": "{name}: serialize the output schema with json.dumps",
    "shuffled_chunks": "{name}: put the retrieved passages first",
}
"""A fault commit's message when the scenario gives none; ``{name}`` is the template's name."""

_VOLATILE_LINE = re.compile(r"\{\{-?\s*(?:now|request_id)\b")
_SORTED_TOOLS = re.compile(r"\btools\s*\|\s*sort\b(?:\([^)]*\))?")
_SORTED_CHUNKS = re.compile(r"\bchunks\s*\|\s*sort\b(?:\([^)]*\))?")
_TOJSON_SCHEMA = re.compile(r"\bschema\s*\|\s*tojson\b")
_CHUNK_LOOP = re.compile(r"\{%-?\s*for\s+\w+\s+in\s+chunks\b.*?\{%-?\s*endfor\s*-?%\}\n?", re.DOTALL)


def apply_fault(text: str, fault: Fault) -> str:
    """The template text after a fault's commit. Raises ValueError when the text lacks what it edits.

    - volatile_top: lines that show ``now`` or ``request_id`` move to the top (DEFAULT_VOLATILE_LINE
      is added there when there are none).
    - unsorted_tools: ``tools | sort(...)`` becomes ``tools``.
    - random_json_keys: ``schema | tojson`` (sorted keys) becomes ``schema | dumps`` (keys as given).
    - shuffled_chunks: the ``{% for ... in chunks %}`` loop moves to the top, its ``| sort`` dropped.
    A fault that would leave the text unchanged (applied twice) is an error too.
    """
    if fault == "volatile_top":
        changed = _volatile_top(text)
    elif fault == "unsorted_tools":
        changed = _substitute(_SORTED_TOOLS, "tools", text, "tools | sort(...)")
    elif fault == "random_json_keys":
        changed = _substitute(_TOJSON_SCHEMA, "schema | dumps", text, "schema | tojson")
    else:
        changed = _chunks_first(text)
    if changed == text:
        raise ValueError("the text would not change")
    return changed


def _volatile_top(text: str) -> str:
    lines = text.splitlines(keepends=True)
    moved = [line for line in lines if _VOLATILE_LINE.search(line)] or [DEFAULT_VOLATILE_LINE]
    kept = [line for line in lines if not _VOLATILE_LINE.search(line)]
    return "".join(line if line.endswith("\n") else line + "\n" for line in moved) + "".join(kept)


def _substitute(pattern: re.Pattern[str], replacement: str, text: str, needed: str) -> str:
    changed, count = pattern.subn(replacement, text)
    if count == 0:
        raise ValueError(f"the text has no `{needed}`")
    return changed


def _chunks_first(text: str) -> str:
    loop = _CHUNK_LOOP.search(text)
    if loop is None:
        raise ValueError("the text has no `{% for ... in chunks %}` loop")
    block = _SORTED_CHUNKS.sub("chunks", loop.group(0))
    block = block if block.endswith("\n") else block + "\n"
    return block + text[: loop.start()] + text[loop.end() :]
