"""Asking a Prefixscope server for its templates' traffic (GET /api/v1/templates/traffic), to price a
change. The token is a personal API token; it is sent, never logged."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import httpx

from app.domain.templatecheck.price import Traffic

TIMEOUT_SECONDS = 15.0


class TrafficUnavailable(Exception):
    """The server could not be asked, or refused, or answered something else than the traffic."""


def fetch_traffic(server: str, token: str | None, *, names: Sequence[str], hours: int) -> dict[str, Traffic]:
    """Each named template's traffic over the last ``hours``, by name (templates the server does not
    know are absent). Raises TrafficUnavailable."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{server.rstrip('/')}/api/v1/templates/traffic"
    try:
        response = httpx.get(
            url, params={"hours": hours, "name": list(names)}, headers=headers, timeout=TIMEOUT_SECONDS
        )
    except httpx.HTTPError as exc:
        raise TrafficUnavailable(f"{url}: {type(exc).__name__}") from None
    if response.status_code != 200:
        raise TrafficUnavailable(f"{url} answered {response.status_code}")
    try:
        return _parsed(response.json())
    except (ValueError, KeyError, TypeError) as exc:
        raise TrafficUnavailable(f"{url}: not a traffic answer ({exc})") from None


def _parsed(body: dict) -> dict[str, Traffic]:  # type: ignore[type-arg]
    hours = _hours(body["since"], body["until"])
    price = float(body["gpu_hour_price"])
    found = {}
    for row in body["templates"]:
        found[str(row["name"])] = Traffic(
            name=str(row["name"]), requests=int(row["requests"]),
            requests_per_hour=float(row["requests_per_hour"]),
            reused_tokens_per_request=float(row["reused_tokens_per_request"]),
            prompt_tokens_per_request=float(row["prompt_tokens_per_request"]),
            block_size=None if row.get("block_size") is None else int(row["block_size"]),
            prefill_tokens_per_second=float(row["prefill_tokens_per_second"]),
            prefill_rate_source=str(row["prefill_rate_source"]), gpu_hour_price=price, window_hours=hours,
        )  # fmt: skip
    return found


def _hours(since: str, until: str) -> float:
    return (datetime.fromisoformat(until) - datetime.fromisoformat(since)).total_seconds() / 3600
