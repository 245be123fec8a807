"""Whether a new template version reuses less than the version it replaced: a deploy's own test.

A blind change point (app/domain/changepoints.py) must find where a scope's per-minute rate moved,
search every split and pay for it (Bonferroni over the segments), and wait for whole minutes. When
a version goes live the split is known: its requests against those of the version before it,
request by request, inside the very minute it went live. That is faster and more certain.

Cold starts are not a regression: the first request of a version on each placement (a server and a
salt: where its prefix can be resident) has nothing of the new text to reuse yet, whatever the
commit did, so each placement's first request of either version is left out. What is left is the
version's steady reuse: a harmless edit's equals the version before it, a volatile line's does not.

The test: each version's token-weighted rate (reused over prompt tokens) is a ratio estimator whose
variance comes from its own requests (the delta method: no binomial assumption, so requests of one
prompt shape that hit or miss together count as they scatter). The drop over its standard error is
a one-sided z; its p-value is multiplied by `looks` (the check runs again as requests arrive, each a
look at the same split: Bonferroni over them), and a change below `min_confidence` is none.
"""

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime

from app.domain.changepoints import DetectionConfig, RateChange

# Each side's standard error is at least this: a version whose requests all reused the same share
# (a template of one prompt shape) would otherwise make any wobble of the other infinitely sure.
MIN_STANDARD_ERROR = 0.01


@dataclass(frozen=True, slots=True)
class RequestReuse:
    """One request of a template version: where it ran, its prompt tokens and what was reused."""

    arrived_at: datetime
    placement: Hashable  # (server, salt): a prefix is resident per server and salt
    prompt_tokens: int
    reused_tokens: int


@dataclass(frozen=True, slots=True)
class DeployTest:
    """What the deploy check needs beyond the detection's own configuration."""

    min_requests: int = 20  # warm requests on each side
    looks: int = 60  # how often one deploy is tested as its requests arrive (Bonferroni)


def warm(requests: Sequence[RequestReuse]) -> list[RequestReuse]:
    """The requests in time order without each placement's first (a cold start)."""
    seen: set[Hashable] = set()
    found = []
    for request in sorted(requests, key=lambda r: r.arrived_at):
        if request.placement in seen:
            found.append(request)
        seen.add(request.placement)
    return found


def version_change(
    before: Sequence[RequestReuse],
    after: Sequence[RequestReuse],
    config: DetectionConfig,
    test: DeployTest,
) -> RateChange | None:
    """The drop from the version before (`before`: its requests) to the new one (`after`: its
    requests since it went live), on warm requests only; None without `test.min_requests` warm ones
    on each side. The change's minute is the new version's first request's (floored to its minute);
    `confidence` is 1 - the looks-corrected one-sided p-value, `is_regression` as the blind search's
    (material and with the evidence; confidence is the caller's bar to check)."""
    earlier, later = warm(before), warm(after)
    if min(len(earlier), len(later)) < test.min_requests or not after:
        return None
    rate_before, error_before = _rate_and_error(earlier)
    rate_after, error_after = _rate_and_error(later)
    drop = rate_before - rate_after
    statistic = drop / math.hypot(error_before, error_after)
    p_value = 0.5 * math.erfc(statistic / math.sqrt(2.0))
    first = min(request.arrived_at for request in after)
    return RateChange(
        index=0,
        minute=first.replace(second=0, microsecond=0),
        rate_before=rate_before,
        rate_after=rate_after,
        requests_before=len(earlier),
        requests_after=len(later),
        prompt_tokens_before=sum(r.prompt_tokens for r in earlier),
        prompt_tokens_after=sum(r.prompt_tokens for r in later),
        drop=drop,
        statistic=statistic,
        dispersion=0.0,
        confidence=max(0.0, 1.0 - test.looks * p_value),
        material=drop >= config.min_drop,
        enough_evidence=True,
    )


def _rate_and_error(requests: Sequence[RequestReuse]) -> tuple[float, float]:
    """The token-weighted rate and its standard error (the ratio estimator's, by the delta method)."""
    prompt = sum(r.prompt_tokens for r in requests)
    rate = sum(r.reused_tokens for r in requests) / prompt
    mean_prompt = prompt / len(requests)
    residuals = sum((r.reused_tokens - rate * r.prompt_tokens) ** 2 for r in requests)
    variance = residuals / (len(requests) - 1) / len(requests) / mean_prompt**2
    return rate, max(math.sqrt(variance), MIN_STANDARD_ERROR)
