"""A sparkline's numbers, as static/charts/charts.js draws them in a table cell (data-chart="spark",
templates/dashboard/_spark.html): the Fleet page's servers and the Templates list's templates."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any


def spark(
    key: str,
    values: Sequence[float | None],
    times: Sequence[datetime],
    *,
    name: str,
    label: str,
    described: str,
) -> dict[str, Any]:
    """The sparkline of one row: `key` names its figure (its JSON is `<key>-data`); `described` is what a
    screen reader hears. A row with no value in the window draws "—". Times as Unix seconds, to stay short."""
    drawn = any(value is not None for value in values)
    series = [{"name": name, "label": label, "values": list(values)}] if drawn else []
    data = {"unit": "ratio", "times": [int(at.timestamp()) for at in times], "series": series}
    return {"figure": key, "id": f"{key}-data", "described": described, "data": data}
