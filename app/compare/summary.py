"""The figures beside the token stream: the cost estimate and the compatibility records side by
side. Pure (app.domain.divergence matches hash-only records to the block)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from app.domain.divergence import REUSE_FIELDS, Compatibility


@dataclass(frozen=True, slots=True)
class PrefillSlope:
    """TTFT seconds per uncached prompt token measured on a server, and the requests behind it.

    ``seconds_per_token`` is None when it could not be measured (too few requests, or no server).
    """

    server_name: str
    seconds_per_token: float | None
    samples: int


@dataclass(frozen=True, slots=True)
class Estimate:
    """What the wasted prefill tokens cost, under a stated assumption (``basis``)."""

    wasted_tokens: int
    seconds_per_token: float
    basis: str
    measured: bool
    gpu_hour_price: float  # PREFIXSCOPE_GPU_HOUR_PRICE, to turn prefill seconds into money

    @property
    def ttft_seconds(self) -> float:
        """Extra time to first token of one request like b."""
        return self.wasted_tokens * self.seconds_per_token

    @property
    def gpu_seconds_per_1000(self) -> float:
        """GPU time spent recomputing the wasted tokens of 1,000 requests like b."""
        return 1000 * self.ttft_seconds

    @property
    def usd_per_1000(self) -> float:
        return self.gpu_seconds_per_1000 / 3600 * self.gpu_hour_price


def estimate(
    wasted_tokens: int, slope: PrefillSlope, *, assumed_tokens_per_second: float, gpu_hour_price: float
) -> Estimate:
    """The cost of ``wasted_tokens``: at the measured TTFT slope when there is one, else at
    ``assumed_tokens_per_second`` (PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND)."""
    seconds_per_token = slope.seconds_per_token
    if seconds_per_token is not None and seconds_per_token > 0:
        basis = (
            f"measured on {slope.server_name}: the slope of TTFT over uncached prompt tokens of "
            f"{slope.samples:,} requests in the last hour, {1 / seconds_per_token:,.0f} prefill tokens/s"
        )
        return Estimate(wasted_tokens, seconds_per_token, basis, True, gpu_hour_price)
    basis = (
        f"configured {assumed_tokens_per_second:,.0f} prefill tokens/s "
        "(PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND; no measured TTFT slope)"
    )
    return Estimate(wasted_tokens, 1 / assumed_tokens_per_second, basis, False, gpu_hour_price)


@dataclass(frozen=True, slots=True)
class CompatibilityRow:
    """One field of the two compatibility records; ``blocks``: a difference stops all reuse."""

    field: str
    a: str
    b: str
    differs: bool
    blocks: bool

    @property
    def effect(self) -> str:
        if not self.differs:
            return ""
        return "blocks all reuse" if self.blocks else "noted: reuse follows the token ids"


def compatibility_rows(a: Compatibility, b: Compatibility) -> list[CompatibilityRow]:
    """Every compatibility field side by side, in the record's order."""
    rows = []
    for field in (f.name for f in fields(Compatibility)):
        a_value, b_value = getattr(a, field), getattr(b, field)
        if field == "tenant_salt":
            a_value, b_value = a_value or None, b_value or None  # an empty salt is no salt
        differs = a_value != b_value
        rows.append(
            CompatibilityRow(
                field=field,
                a=_shown(field, a_value),
                b=_shown(field, b_value),
                differs=differs,
                blocks=differs and field in REUSE_FIELDS,
            )
        )
    return rows


def _shown(field: str, value: str | None) -> str:
    if value is None:
        return "none" if field in ("lora_adapter", "lora_path", "tenant_salt") else "—"
    if field == "tenant_salt":
        return f"sha256 {value[:12]}…" if len(value) == 64 else "(set)"
    if field == "template_version":
        return value[:12]
    return value
