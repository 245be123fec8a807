"""How the product writes a figure in a table or panel, the same on every page."""


def percent(ratio: float | None) -> str:
    """A ratio in per cent to a tenth, as every table and panel writes one; "—" for none."""
    return "—" if ratio is None else f"{100 * ratio:.1f} %"
