"""A template's traffic before a check, read from the request rollups, and the checks of imported
versions priced with it (app/domain/templatecheck/price.py: the product's one cost model).

The traffic of a check made at ``until``: its template's requests an hour over the day before, from
its first request in that day when that is later (a template live for ten minutes is not spread over
24 hours); the tokens a request reuses now (over the last hour, else the day): the hit rate of the
requests whose cached tokens are known, times the prompt tokens per request; the prefill rate
measured on the template's requests of the day (app/domain/prefill.py), else the configured one.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Min, Sum

from app.core.tenancy import SEES_ALL
from app.diagnosis.cost import prefill_sums, request_rollups
from app.domain.prefill import prefill_tokens_per_second
from app.domain.templatecheck.change import Change
from app.domain.templatecheck.price import Predicted, Traffic, predict
from app.prompts import services
from app.prompts.models import VersionCheck
from app.traffic.models import MinuteRollup

logger = logging.getLogger(__name__)

DAY = timedelta(hours=24)
NOW = timedelta(hours=1)  # "reused now": the last hour's requests, when it has any


@dataclass(frozen=True, slots=True)
class _Sums:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_known_prompt_tokens: int = 0
    first: datetime | None = None  # the start of the first minute (or hour) with requests


def template_traffic(*, template_id: int, name: str, until: datetime) -> Traffic | None:
    """The template's traffic over the day before ``until`` (the module's docstring); None when it
    had no request then, or none whose cached tokens are known (its reuse is unknown)."""
    day = _sums(template_id, since=until - DAY, until=until)
    if not day.requests or not day.cache_known_prompt_tokens or day.first is None:
        return None
    hour = _sums(template_id, since=until - NOW, until=until)
    recent = hour if hour.requests and hour.cache_known_prompt_tokens else day
    hit_rate = recent.cached_tokens / recent.cache_known_prompt_tokens
    hours = max((until - max(day.first, until - DAY)) / timedelta(hours=1), 1 / 60)
    measured = prefill_tokens_per_second(
        prefill_sums(since=until - DAY, until=until, template_id=template_id)
    )
    return Traffic(
        name=name, requests=day.requests, requests_per_hour=day.requests / hours,
        reused_tokens_per_request=hit_rate * recent.prompt_tokens / recent.requests,
        prompt_tokens_per_request=day.prompt_tokens / day.requests, block_size=None,
        prefill_tokens_per_second=measured or settings.PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND,
        prefill_rate_source="measured" if measured else "configured",
        gpu_hour_price=settings.PREFIXSCOPE_GPU_HOUR_PRICE, window_hours=hours,
    )  # fmt: skip


def _sums(template_id: int, *, since: datetime, until: datetime) -> _Sums:
    found = _Sums()
    for part in request_rollups(since=since, until=until, viewer=SEES_ALL):
        time = "minute" if part.model is MinuteRollup else "hour"
        row = part.filter(template_id=template_id, requests__gt=0).aggregate(
            requests=Sum("requests"), prompt_tokens=Sum("prompt_tokens"), cached_tokens=Sum("cached_tokens"),
            cache_known_prompt_tokens=Sum("cache_known_prompt_tokens"), first=Min(time),
        )  # fmt: skip
        firsts = [t for t in (found.first, row["first"]) if t is not None]
        found = _Sums(
            found.requests + (row["requests"] or 0), found.prompt_tokens + (row["prompt_tokens"] or 0),
            found.cached_tokens + (row["cached_tokens"] or 0),
            found.cache_known_prompt_tokens + (row["cache_known_prompt_tokens"] or 0),
            min(firsts) if firsts else None,
        )  # fmt: skip
    return found


def price_version_checks(*, version_ids: Sequence[int], now: datetime) -> int:
    """Price the checks of these versions not priced yet with their template's traffic before each
    check; a check with nothing to compare (a template's first version, or one that could not run)
    or whose template had no traffic is marked priced with no price. How many got a price."""
    checks = VersionCheck.objects.filter(version_id__in=version_ids, priced_at__isnull=True)
    priced = 0
    for check in checks.select_related("version__template"):
        predicted = _predicted(check)
        services.price_version_check(check=check, predicted=predicted, now=now)
        priced += predicted is not None
    logger.info("priced %d of %d version checks", priced, len(version_ids))
    return priced


def _predicted(check: VersionCheck) -> Predicted | None:
    figures = (check.base_stable_tokens, check.head_stable_tokens, check.base_blocks, check.head_blocks)
    if check.block_size is None or any(figure is None for figure in figures):
        return None
    template = check.version.template
    traffic = template_traffic(template_id=template.pk, name=template.name, until=check.checked_at)
    if traffic is None:
        return None
    change = Change(
        check.departs_at_token, check.departs_line, check.base_stable_tokens or 0,
        check.head_stable_tokens or 0, check.base_blocks or 0, check.head_blocks or 0, None,
    )  # fmt: skip
    return predict(traffic, change, block_size=check.block_size)
