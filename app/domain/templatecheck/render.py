"""Rendering a Jinja template so that every character of its output knows the template line it came
from, under a clock and a random seed the caller chooses.

The template is parsed, and before each piece of output (a line of literal text, an expression) a
sentinel naming its *spot* (the line, and the ``for`` loops around it with the variables they iterate)
is inserted into the syntax tree; the compiled template renders the sentinels with the text, and
``Rendered`` takes them out again, keeping where each spot starts. Whitespace control (``trim_blocks``,
``lstrip_blocks``) happens in the lexer, before the tree, so the text is what the application renders.

The environment is sandboxed (templates come from repositories) and has, besides Jinja's filters and
tests, what prompt builders commonly register: ``now()`` (the clock, timezone-aware), ``strftime_now(fmt)``
(Hugging Face chat templates' global), ``uuid4()``, and the filter ``dumps`` (JSON in the mapping's own
key order, where Jinja's ``tojson`` sorts keys). Pure: the clock and the seed are arguments.
"""

from __future__ import annotations

import bisect
import json
import random
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.domain.templatecheck.config import JinjaOptions
from app.domain.templatecheck.perturb import Conditions

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters: no prompt text holds them
_SENTINEL = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


class RenderError(ValueError):
    """The template does not parse or does not render with a sample; the message names the line."""


@dataclass(frozen=True, slots=True)
class Loop:
    """A ``for`` loop around a spot: its line and the variables its iterable reads."""

    line: int
    reads: frozenset[str]


@dataclass(frozen=True, slots=True)
class Spot:
    """Where a piece of output comes from: its template line and the loops around it, outermost first."""

    line: int
    loops: tuple[Loop, ...] = ()

    def line_for(self, variable: str | None) -> int:
        """The line to blame when ``variable`` varies here: the outermost loop over it, else the spot's."""
        for loop in self.loops:
            if variable is not None and variable in loop.reads:
                return loop.line
        return self.line


@dataclass(frozen=True, slots=True)
class Rendered:
    """A render's text, and which spot each stretch of it comes from (starts sorted)."""

    text: str
    starts: tuple[int, ...]
    spots: tuple[Spot, ...]

    def spot_at(self, offset: int) -> Spot:
        """The spot the character at ``offset`` was rendered by (the first spot for text before any)."""
        index = bisect.bisect_right(self.starts, offset) - 1
        return self.spots[max(index, 0)] if self.spots else Spot(1)


class CheckedTemplate:
    """A template compiled with its spots, rendered under chosen conditions."""

    def __init__(self, source: str, options: JinjaOptions, *, name: str) -> None:
        self._environment = _environment(options)
        try:
            tree = self._environment.parse(source, name=name)
        except jinja2.TemplateSyntaxError as exc:
            raise RenderError(f"{name}, line {exc.lineno}: {exc.message}") from None
        self._spots: list[Spot] = []
        _instrument(tree, (), self._spots)
        self._template = self._environment.from_string(tree)
        self.name = name

    def render(self, context: Mapping[str, Any], conditions: Conditions) -> Rendered:
        """The text rendered with ``context``. Raises RenderError (with the line) when it fails."""
        rng = random.Random(conditions.seed)
        extra = {
            "now": lambda: conditions.local_now,
            "strftime_now": lambda fmt: conditions.local_now.strftime(fmt),
            "uuid4": lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        }
        state = random.getstate()  # Jinja's `random` filter draws from the module's generator
        random.seed(conditions.seed)
        try:
            raw = self._template.render({**extra, **context})
        except jinja2.TemplateError as exc:
            raise RenderError(f"{self.name}: {_where(exc)}{exc}") from None
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise RenderError(f"{self.name}: {type(exc).__name__}: {exc}") from None
        finally:
            random.setstate(state)
        return _split(raw, self._spots)


def _environment(options: JinjaOptions) -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=options.trim_blocks,
        lstrip_blocks=options.lstrip_blocks,
        keep_trailing_newline=options.keep_trailing_newline,
    )
    environment.filters["dumps"] = json.dumps
    return environment


def _instrument(node: nodes.Node, loops: tuple[Loop, ...], spots: list[Spot]) -> None:
    """Put a sentinel before each piece of output under ``node``, recording its spot."""
    if isinstance(node, nodes.Output):
        node.nodes = [piece for child in node.nodes for piece in _marked(child, loops, spots)]
    for child in node.iter_child_nodes():
        if isinstance(node, nodes.For) and child in node.body:
            reads = frozenset(name.name for name in _names(node.iter))
            _instrument(child, (*loops, Loop(node.lineno, reads)), spots)
        elif not isinstance(node, nodes.Output) or not isinstance(child, nodes.TemplateData):
            _instrument(child, loops, spots)


def _names(node: nodes.Node) -> list[nodes.Name]:
    return [node] if isinstance(node, nodes.Name) else list(node.find_all(nodes.Name))


def _marked(child: nodes.Expr, loops: tuple[Loop, ...], spots: list[Spot]) -> list[nodes.Expr]:
    def sentinel(line: int) -> nodes.TemplateData:
        spots.append(Spot(line, loops))
        return nodes.TemplateData(f"{_OPEN}{len(spots) - 1}{_CLOSE}", lineno=line)

    if not isinstance(child, nodes.TemplateData):
        return [sentinel(child.lineno), child]
    pieces: list[nodes.Expr] = []
    for offset, line in enumerate(child.data.splitlines(keepends=True)):
        pieces += [sentinel(child.lineno + offset), nodes.TemplateData(line, lineno=child.lineno + offset)]
    return pieces


def _split(raw: str, spots: list[Spot]) -> Rendered:
    text: list[str] = []
    starts: list[int] = []
    found: list[Spot] = []
    length, last = 0, 0
    for match in _SENTINEL.finditer(raw):
        text.append(raw[last : match.start()])
        length += match.start() - last
        starts.append(length)
        found.append(spots[int(match[1])])
        last = match.end()
    text.append(raw[last:])
    return Rendered("".join(text), tuple(starts), tuple(found))


def _where(exc: jinja2.TemplateError) -> str:
    line = getattr(exc, "lineno", None)
    return f"line {line}: " if line else ""


def plain(text: str) -> Rendered:
    """A render without spots: the output of a builder command, whose lines are not the template's."""
    return Rendered(text, (), ())
