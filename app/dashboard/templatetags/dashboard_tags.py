from typing import Any

from django import template

from app.domain.misses import HIT_RATE_DEFINITIONS

register = template.Library()


@register.filter
def of(found: dict[Any, Any], key: Any) -> Any:
    """`shares|of:row.server.pk`: a mapping's value for a row's key (None when it has none)."""
    return found.get(key)


@register.filter
def percent(ratio: float | None) -> str:
    """0.004 -> "0.4 %", 0.93 -> "93 %": a share of 0 to 1, small ones to a tenth of a per cent."""
    if ratio is None:
        return "—"
    shown = 100 * ratio
    return f"{shown:.1f} %" if 0 < shown < 10 else f"{shown:.0f} %"


@register.simple_tag
def hit_rate_definition(name: str) -> str:
    """`{% hit_rate_definition "recorded" %}`: what a hit-rate figure is the share of, from the one
    place that says it (app/domain/misses.py HIT_RATE_DEFINITIONS); an unknown name raises."""
    return HIT_RATE_DEFINITIONS[name]
