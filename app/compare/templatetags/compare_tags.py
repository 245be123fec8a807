"""Number formats of the Compare page (USE_I18N is off, so Django's own grouping is not used)."""

from django import template

register = template.Library()


@register.filter
def thousands(value: int | float | None) -> str:
    """1904 -> "1,904"; None -> "—"."""
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.0f}"


@register.filter
def hex64(value: int | None) -> str:
    """A uint64 wire hash as 16 hex digits; None -> "—"."""
    return "—" if value is None else f"{value:016x}"


@register.filter
def seconds(value: float | None) -> str:
    """A duration with a unit that reads well: µs, ms, s or h."""
    if value is None:
        return "—"
    if value < 0.001:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    if value < 3600:
        return f"{value:,.2f} s"
    return f"{value / 3600:,.2f} h"
