"""The sums of the request records per period: per server and template by the minute and the hour,
and those summed per server or per template (app/rollups/ keeps them)."""

from django.contrib.postgres.fields import ArrayField
from django.db import models

from app.traffic.models.ids import next_id


class RequestTotals(models.Model):
    """Totals of request records per server and template (null: no template) over one period.

    Two TTFT histograms, never mixed: as the clients saw it and as vLLM measured it; `*_buckets`
    count TTFTs per vLLM TTFT histogram bucket, cumulative (app/rollups/refresh.py).
    """

    requests = models.PositiveIntegerField()
    prompt_tokens = models.BigIntegerField()
    cached_tokens = models.BigIntegerField()
    # Prompt tokens of the requests whose cached tokens are known (spans alone do not say):
    # the hit rate is cached_tokens / cache_known_prompt_tokens.
    cache_known_prompt_tokens = models.BigIntegerField(default=0)
    # Of them, the hosted-API requests' (a provider's usage: cache read / input tokens; not those a
    # gateway answered from its semantic cache, which no provider saw): their own hit rate. Database
    # defaults: a writer of the version before names neither column.
    hosted_cached_tokens = models.BigIntegerField(default=0, db_default=0)
    hosted_known_prompt_tokens = models.BigIntegerField(default=0, db_default=0)
    client_ttft_count = models.PositiveIntegerField(default=0)
    client_ttft_sum_seconds = models.FloatField(default=0)
    client_ttft_buckets = ArrayField(models.IntegerField(), default=list)
    server_ttft_count = models.PositiveIntegerField(default=0)
    server_ttft_sum_seconds = models.FloatField(default=0)
    server_ttft_buckets = ArrayField(models.IntegerField(), default=list)
    # Quantile sketches of the same TTFTs, {bucket index: count} (app/domain/sketch.py): quantiles
    # within 0.5 % of the records' own, where the fixed buckets above read 131 ms as 175 ms.
    client_ttft_sketch = models.JSONField(default=dict, db_default={})
    server_ttft_sketch = models.JSONField(default=dict, db_default={})
    # The sums a least-squares line of TTFT (vLLM's, else the client's) over uncached prompt tokens
    # needs, for the requests with both: its slope is a prefill rate measured from any rows summed.
    prefill_count = models.PositiveIntegerField(default=0)
    prefill_uncached_sum = models.FloatField(default=0)
    prefill_ttft_sum = models.FloatField(default=0)
    prefill_uncached_squares = models.FloatField(default=0)
    prefill_cross_sum = models.FloatField(default=0, help_text="Sum of uncached tokens times TTFT seconds")

    class Meta:
        abstract = True


class MinuteRollup(RequestTotals):
    """Per-minute totals of request records per server and template (null: no template).

    Dashboards read these, never raw request records, for windows longer than an hour.
    """

    pk = models.CompositePrimaryKey("server", "id")
    id = models.BigIntegerField(db_default=next_id("traffic_minuterollup"), editable=False)
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    template = models.ForeignKey("prompts.Template", null=True, blank=True, on_delete=models.CASCADE)
    minute = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["server", "template", "minute"], name="minute_rollup_identity", nulls_distinct=False
            ),
        ]
        indexes = [models.Index(fields=["minute"], name="minute_rollup_time")]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.template_id} {self.minute:%Y-%m-%d %H:%M}"


class HourRollup(RequestTotals):
    """The minute rollups summed per hour, for series of a day or longer (a week of a fleet's
    minutes is too many rows to sum per request). Recomputed from the minutes whenever they are."""

    pk = models.CompositePrimaryKey("server", "id")
    id = models.BigIntegerField(db_default=next_id("traffic_hourrollup"), editable=False)
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    template = models.ForeignKey(
        "prompts.Template", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    hour = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["server", "template", "hour"], name="hour_rollup_identity", nulls_distinct=False
            ),
        ]
        # A template's page and the Templates list read a week of one template's hours; the list sums
        # every template's totals over a week and the week before: from this index alone (index-only
        # scan, a tenth of the table's pages; the server for a tenant's filter).
        indexes = [
            models.Index(fields=["hour"], name="hour_rollup_time"),
            models.Index(
                fields=["template", "hour"],
                include=["server", "requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens"],
                name="hour_rollup_template_sums",
            ),
            # A tenant's Templates list reads its servers' rows of the shared templates (its own
            # templates' from TemplateRequestHour): from this index alone, its servers' rows only.
            models.Index(
                fields=["server", "hour"],
                include=[
                    "template",
                    "requests",
                    "prompt_tokens",
                    "cached_tokens",
                    "cache_known_prompt_tokens",
                ],
                name="hour_rollup_server_sums",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.template_id} {self.hour:%Y-%m-%d %H}h"


class ServerRequestHour(RequestTotals):
    """The hour rollups of one server summed over its templates: what the Fleet page and the fleet's
    series read for whole hours, a week of a fleet being servers x 168 rows, not x templates too.

    Tenancy (app/rollups/visibility.py): these sums serve the servers the viewer's
    tenants own; the other servers' rows of its templates stay in HourRollup. Recomputed from the
    hour rollups whenever they are (app/rollups/refresh.py).
    """

    pk = models.CompositePrimaryKey("server", "hour")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="server_request_hour_time")]

    def __str__(self) -> str:
        return f"{self.server_id} {self.hour:%Y-%m-%d %H}h"


class TemplateRequestHour(RequestTotals):
    """The hour rollups of one template summed over the servers that served it: what the Templates
    list and a template's page read for whole hours, a week of every template being templates x 168
    rows, not x servers too. Rows of no template are not summed (those pages read none).

    Tenancy (app/rollups/visibility.py): these sums serve the templates the
    viewer's tenants own, every server's row of those being theirs; a shared template's sum holds other
    tenants' servers' rows, so its rows on the viewer's servers are read from HourRollup. Recomputed
    from the hour rollups whenever they are (app/rollups/refresh.py). No server: a small table
    (templates x hours, not traffic), a reference table beside the distributed ones, not one of them
    (tests/core/test_shardable_schema.py).
    """

    pk = models.CompositePrimaryKey("template", "hour")
    template = models.ForeignKey("prompts.Template", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="template_request_hour_time")]

    def __str__(self) -> str:
        return f"{self.template_id} {self.hour:%Y-%m-%d %H}h"


class ServerRequestMinute(RequestTotals):
    """The minute rollups of one server summed over its templates: what the Fleet page reads for the
    minutes of its window (an hour of a fleet is servers x 60 rows, not x templates too).

    Tenancy as ServerRequestHour's (app/rollups/visibility.py): the other servers' rows of a viewer's
    templates stay in MinuteRollup. Recomputed from the minutes in the transaction that writes them.
    """

    pk = models.CompositePrimaryKey("server", "minute")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["minute"], name="server_request_minute_time")]

    def __str__(self) -> str:
        return f"{self.server_id} {self.minute:%Y-%m-%d %H:%M}"
