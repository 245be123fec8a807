"""The sum tables: request records, server metrics, diagnoses' losses and unsalted first blocks
summed per period, what the pages read instead of raw rows (app/rollups/ keeps them)."""

from django.contrib.postgres.fields import ArrayField
from django.db import models

from collectors import records


def _next_id(table: str) -> models.Func:
    """The next value of a rollup table's own id sequence (the initial migration makes it).

    The rollups' primary key is (server, id), so that Citus can distribute them by server
    (tests/core/test_shardable_schema.py): `id` is no longer the primary key, so it cannot be an
    AutoField, and the database fills it in as an AutoField's identity did.
    """
    return models.Func(
        models.Value(f"{table}_id_seq"), function="nextval", output_field=models.BigIntegerField()
    )


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
    id = models.BigIntegerField(db_default=_next_id("traffic_minuterollup"), editable=False)
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
    id = models.BigIntegerField(db_default=_next_id("traffic_hourrollup"), editable=False)
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


class LossTotals(models.Model):
    """Sums of the diagnoses (app/diagnosis/run.py) over one period per server,
    template, template version and tenant: the funnel's steps and the tokens lost per cause."""

    tenant = models.CharField(max_length=records.TENANT_MAX, blank=True)
    requests = models.PositiveIntegerField()
    diagnosed = models.PositiveIntegerField(help_text="Requests with a diagnosis (the rest: unknown)")
    unexpected_hits = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    # Of the diagnosed requests alone: their hit rate is reused_tokens / diagnosed_prompt_tokens (a
    # request without a diagnosis, its cached tokens unknown, reused nothing that is known).
    diagnosed_prompt_tokens = models.BigIntegerField(default=0)
    seen_before_tokens = models.BigIntegerField(default=0)
    resident_anywhere_tokens = models.BigIntegerField(default=0)
    resident_here_tokens = models.BigIntegerField(default=0)
    reused_tokens = models.BigIntegerField(default=0)
    prompt_changed_tokens = models.BigIntegerField(default=0)
    evicted_tokens = models.BigIntegerField(default=0)
    routed_elsewhere_tokens = models.BigIntegerField(default=0)
    salt_tokens = models.BigIntegerField(default=0)
    restarted_tokens = models.BigIntegerField(default=0)
    below_block_tokens = models.BigIntegerField(default=0)
    cold_tokens = models.BigIntegerField(default=0)
    unexplained_tokens = models.BigIntegerField(default=0)
    no_kv_events_tokens = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class LossMinute(LossTotals):
    """Per-minute sums of the diagnoses.

    Dashboards, the REST API and the tenant audit read these, never raw diagnoses. Routing
    effectiveness of a group of compatible servers is its reused / resident-anywhere tokens.
    """

    pk = models.CompositePrimaryKey("server", "id")
    id = models.BigIntegerField(db_default=_next_id("traffic_lossminute"), editable=False)
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    template = models.ForeignKey("prompts.Template", null=True, blank=True, on_delete=models.CASCADE)
    template_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    minute = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["server", "template", "template_version", "tenant", "minute"],
                name="loss_minute_identity",
                nulls_distinct=False,
            ),
        ]
        indexes = [
            models.Index(fields=["minute"], name="loss_minute_time"),
            # A tenant's view of the fleet's quarter hours (ServerLossQuarter) reads these few rows
            # from the minutes: tenant-less ones, of its templates on servers it does not own.
            models.Index(
                fields=["template", "minute"], name="loss_minute_untenanted", condition=models.Q(tenant="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.template_id}/{self.tenant} {self.minute:%Y-%m-%d %H:%M}"


class LossHour(LossTotals):
    """The loss minutes summed per hour, for series of a day or longer. Recomputed from the
    minutes whenever they are."""

    pk = models.CompositePrimaryKey("server", "id")
    id = models.BigIntegerField(db_default=_next_id("traffic_losshour"), editable=False)
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    template = models.ForeignKey(
        "prompts.Template", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    template_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    hour = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["server", "template", "template_version", "tenant", "hour"],
                name="loss_hour_identity",
                nulls_distinct=False,
            ),
        ]
        indexes = [
            models.Index(fields=["hour"], name="loss_hour_time"),
            models.Index(fields=["template", "hour"], name="loss_hour_template_time"),
            # A tenant's Templates list: the tenant-less rows of its servers (TemplateLossHour's
            # app/rollups/visibility.py), a few among the tenants' ones.
            models.Index(
                fields=["server", "hour"], name="loss_hour_untenanted", condition=models.Q(tenant="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.template_id}/{self.tenant} {self.hour:%Y-%m-%d %H}h"


class ServerLossHour(LossTotals):
    """The loss hours of one server and tenant summed over templates and versions: the fleet's lost
    tokens over a day or a week, a server having one tenant or a few, never x templates x versions.

    Tenancy (app/rollups/visibility.py): these sums serve the rows of the viewer's tenants and the tenant-less
    rows of its servers; tenant-less rows of its templates on other servers stay in LossHour.
    Recomputed from the loss hours whenever they are.
    """

    pk = models.CompositePrimaryKey("server", "tenant", "hour")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="server_loss_hour_time")]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.tenant} {self.hour:%Y-%m-%d %H}h"


class ServerLossQuarter(LossTotals):
    """The loss minutes of one server and tenant summed per quarter hour: the fleet's and a tenant's
    lost tokens in buckets of 15 minutes (a day of a fleet is a few rows per server and quarter, not
    one per server, template, version, tenant and minute). `minute` is the quarter's first.

    Tenancy as ServerLossHour's; the tenant-less rows of a viewer's templates on other servers stay
    in LossMinute (its index loss_minute_untenanted). Recomputed from the minutes whenever they are.
    """

    pk = models.CompositePrimaryKey("server", "tenant", "minute")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["minute"], name="server_loss_quarter_time")]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.tenant} {self.minute:%Y-%m-%d %H:%M}+15min"


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


class TemplateLossHour(LossTotals):
    """The loss hours of one template and tenant summed over servers and versions: a template's lost
    tokens over a day or a week, for the Templates list and the template's page.

    Tenancy (app/rollups/visibility.py): these sums serve the rows of the viewer's tenants and the
    tenant-less rows of its templates; the tenant-less rows of shared templates on its servers are
    read from LossHour. Recomputed from the loss hours whenever they are; a small table, as
    TemplateRequestHour.
    """

    pk = models.CompositePrimaryKey("template", "hour", "tenant")
    template = models.ForeignKey("prompts.Template", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="template_loss_hour_time")]

    def __str__(self) -> str:
        return f"{self.template_id}/{self.tenant} {self.hour:%Y-%m-%d %H}h"


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


class ServerLossMinute(LossTotals):
    """The loss minutes of one server and tenant summed over templates and versions: the Fleet page's
    lost tokens and routing over the minutes of its window.

    Tenancy as ServerLossHour's (app/rollups/visibility.py): the tenant-less rows of a viewer's templates on
    other servers stay in LossMinute. Recomputed from the minutes in the transaction that writes them.
    """

    pk = models.CompositePrimaryKey("server", "tenant", "minute")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["minute"], name="server_loss_minute_time")]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.tenant} {self.minute:%Y-%m-%d %H:%M}"


class ServerTotals(models.Model):
    """A server's own readings summed over one period: its /metrics pulls (counter growth, the KV
    usage gauge, vLLM's TTFT histogram) and the blocks its KV events removed.

    Counters grow between two pulls in the period of the later one, a reset counting in full (as
    app.domain.hitrate.counter_increase); growth across a silence longer than SCRAPE_GAP is not
    counted, so a period's figures do not depend on when it was rolled up. Sums only, so that any
    periods add up; ratios and quantiles are taken of the sums (app/rollups/servers.py).
    """

    scrapes = models.PositiveIntegerField(default=0)
    failed_scrapes = models.PositiveIntegerField(default=0)
    prefix_queries = models.FloatField(default=0, help_text="Tokens queried (prefix-cache counter growth)")
    prefix_hits = models.FloatField(default=0, help_text="Tokens hit (prefix-cache counter growth)")
    preemptions = models.FloatField(default=0)
    finished_requests = models.FloatField(default=0)
    kv_usage_sum = models.FloatField(default=0, help_text="Sum of vllm:kv_cache_usage_perc samples")
    kv_usage_samples = models.PositiveIntegerField(default=0)
    kv_usage_max = models.FloatField(null=True, blank=True)
    # vLLM's own TTFT histogram: growth of its count, sum and cumulative buckets (TTFT_BUCKETS_SECONDS,
    # then +Inf), the requests it served whoever sent them.
    ttft_count = models.FloatField(default=0)
    ttft_sum_seconds = models.FloatField(default=0)
    ttft_buckets = ArrayField(models.BigIntegerField(), default=list)
    evictions = models.PositiveIntegerField(default=0, help_text="Blocks removed, from the KV events")

    class Meta:
        abstract = True


class ServerMinute(ServerTotals):
    """A server's readings per minute: what the Fleet page and long server series read, never raw
    scrape samples or KV events (kept for hours only)."""

    pk = models.CompositePrimaryKey("server", "minute")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["minute"], name="server_minute_time")]

    def __str__(self) -> str:
        return f"{self.server_id} {self.minute:%Y-%m-%d %H:%M}"


class ServerHour(ServerTotals):
    """The server minutes summed per hour, for a day or longer. Recomputed from the minutes whenever
    they are."""

    pk = models.CompositePrimaryKey("server", "hour")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="server_hour_time")]

    def __str__(self) -> str:
        return f"{self.server_id} {self.hour:%Y-%m-%d %H}h"


class TenantSalt(models.Model):
    """A cache salt (its hash) a tenant's requests carried, and when: a new one is a salt rotation,
    which Prefixscope tells as a notice (SaltRotated) rather than as a drop. Filled by the minute
    rollups from the records; never deleted (a count that fell would read as a rotation)."""

    tenant = models.CharField(max_length=records.TENANT_MAX)
    salt_hash = models.CharField(max_length=64, blank=True, help_text="'' for unsalted requests")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "salt_hash"], name="tenant_salt_identity")]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.salt_hash[:12] or 'unsalted'}"


class UnsaltedPrefixTotals(models.Model):
    """Unsalted requests of one tenant (and template) that began with one first block, over one
    period: what the salt audit (app/traffic/selectors.py shared_unsalted_prefixes) reads instead of
    the records, whose first block is the first element of a TOASTed array per row.

    Only the first blocks at least two requests sent in the same hour are kept: a first block no other
    request sent that hour cannot be a template's shared prefix (a volatile first token makes each
    request's first block its own), and keeping those would make these tables as long as the records.
    Not keyed by server: the audit sums a first block across the fleet, a server would multiply the
    rows by the servers a template is routed to (tenfold on the bench fleet).
    """

    model = models.CharField(max_length=records.MODEL_MAX, blank=True)
    first_block = models.BigIntegerField(
        help_text="The first block hash, a uint64 as a two's-complement bigint"
    )
    tenant = models.CharField(max_length=records.TENANT_MAX)
    template = models.ForeignKey(
        "prompts.Template", null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    requests = models.PositiveIntegerField()
    # The latest request's key, for the audit's link to it (arrived_at: last_seen_at).
    last_seen_at = models.DateTimeField()
    last_server = models.ForeignKey(
        "fleet.Server", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    last_request_id = models.CharField(max_length=records.REQUEST_ID_MAX)

    class Meta:
        abstract = True


class UnsaltedPrefixMinute(UnsaltedPrefixTotals):
    """Per-minute unsalted first blocks (UnsaltedPrefixTotals): the audit reads them at the window's
    edges, the hours between from UnsaltedPrefixHour. Recomputed per whole hour from the records."""

    minute = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "model", "first_block", "tenant", "template"],
                name="unsalted_prefix_minute_identity",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.first_block % 2**64:016x}/{self.tenant} {self.minute:%Y-%m-%d %H:%M}"


class UnsaltedPrefixHour(UnsaltedPrefixTotals):
    """The unsalted prefix minutes summed per hour. Recomputed from the minutes whenever they are."""

    hour = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "model", "first_block", "tenant", "template"],
                name="unsalted_prefix_hour_identity",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.first_block % 2**64:016x}/{self.tenant} {self.hour:%Y-%m-%d %H}h"
