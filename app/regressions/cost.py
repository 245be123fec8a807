"""A hit-rate regression's cost: its scope's cost (app/diagnosis/cost.py, the one cost model) over the
window since its change, the last COST_WINDOW at most, up to the last whole minute the diagnosis
had summed when it was last updated. Its headline (lost_tokens_per_hour, GPU-seconds, money) is the
part of those lost tokens over what the scope lost at its rate before: what reverting or fixing
the change wins back; scope_lost_tokens_per_hour keeps the whole, the figure the template page
and GET /api/v1/cost show for the same window. Its page and the API state that window and both."""

from datetime import datetime, timedelta

from django.conf import settings

from app.diagnosis.cost import scope_cost
from app.domain.cost import Cost
from app.regressions.models import Regression

COST_WINDOW = timedelta(hours=1)
_TENANT_SCOPES = (Regression.Scope.TENANT, Regression.Scope.TEMPLATE_TENANT)


def cost_window(changed_at: datetime, summed_until: datetime) -> tuple[datetime, datetime]:
    """[since, until): from its change (the last COST_WINDOW at most) to the last whole minute
    summed; at least the minute of its change."""
    until = summed_until.replace(second=0, microsecond=0)
    since = max(changed_at, until - COST_WINDOW)
    return since, max(until, since + timedelta(minutes=1))


def cost_window_of(regression: Regression) -> tuple[datetime, datetime]:
    """The window its stored cost was priced over (at its last update)."""
    summed = regression.updated_at - timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS)
    return cost_window(regression.changed_at, summed)


def price(regression: Regression, *, summed_until: datetime) -> Cost:
    """Its scope's cost over its cost window, and the fields that keep it set on `regression`."""
    since, until = cost_window(regression.changed_at, summed_until)
    found = scope_cost(
        since=since,
        until=until,
        server_id=regression.server_id,
        template_id=regression.template_id,
        tenant=regression.tenant if regression.scope in _TENANT_SCOPES else None,
        rate_before=regression.rate_before,
    )
    assert found.over_before is not None  # priced against its rate before
    regression.lost_tokens_per_hour = found.over_before.tokens_per_hour
    regression.scope_lost_tokens_per_hour = found.tokens_per_hour
    regression.prefill_tokens_per_second = found.prefill_tokens_per_second
    regression.prefill_rate_source = found.rate_source
    regression.gpu_seconds_per_hour = found.over_before.gpu_seconds_per_hour
    regression.cost_per_hour = found.over_before.money_per_hour
    return found
