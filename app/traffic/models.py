"""Raw traffic as collected (scrapes, KV events, request records) and the per-minute rollup.

The three raw tables are partitioned by day (see app/traffic/services/partitions.py). Their primary
keys are the natural identity of what arrives, server first, so that a redelivered scrape,
event or request is written once (ON CONFLICT DO NOTHING / COPY into a staging table), and so
that Citus could shard them by server unchanged.
"""

import operator
from functools import reduce

from django.contrib.postgres.fields import ArrayField
from django.db import models
from psqlextra.models import PostgresPartitionedModel
from psqlextra.types import PostgresPartitioningMethod

from app.core.fields import UInt64Field
from collectors import records


class Scrape(PostgresPartitionedModel):
    """The outcome of one /metrics pull; a failed pull marks the server down, it is not zeros."""

    pk = models.CompositePrimaryKey("server", "scraped_at")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    scraped_at = models.DateTimeField()
    ok = models.BooleanField()
    error = models.TextField(blank=True)
    duration_seconds = models.FloatField()
    sample_count = models.PositiveIntegerField(default=0)

    class PartitioningMeta:
        method = PostgresPartitioningMethod.RANGE
        key = ["scraped_at"]

    def __str__(self) -> str:
        return f"{self.server_id} @ {self.scraped_at:%Y-%m-%d %H:%M:%S} {'ok' if self.ok else 'failed'}"


class MetricSeries(models.Model):
    """One time series of one server: a metric name and its label set, as exposed."""

    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="series")
    name = models.CharField(max_length=200, help_text="Sample name, e.g. vllm:prefix_cache_hits_total")
    labels = models.JSONField(default=dict)
    kind = models.CharField(max_length=20, help_text="counter, gauge, histogram, ...")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["server", "name", "labels"], name="metric_series_identity"),
        ]

    def __str__(self) -> str:
        return f"{self.name}{self.labels}"


class ScrapeSample(PostgresPartitionedModel):
    """One sample value of one series in one scrape, stored as scraped (counters stay cumulative)."""

    pk = models.CompositePrimaryKey("server", "series", "scraped_at")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    series = models.ForeignKey(MetricSeries, on_delete=models.CASCADE, related_name="+")
    scraped_at = models.DateTimeField()
    value = models.FloatField()

    class PartitioningMeta:
        method = PostgresPartitioningMethod.RANGE
        key = ["scraped_at"]

    def __str__(self) -> str:
        return f"{self.series_id} @ {self.scraped_at}: {self.value}"


class KVEvent(PostgresPartitionedModel):
    """One block of one KV-cache event, as received over ZMQ (one row per block hash).

    A batch has a sequence number per server and data-parallel rank; a sequence going
    backwards means the server restarted, which starts a new epoch.
    """

    class Kind(models.IntegerChoices):
        STORED = 1, "BlockStored"
        REMOVED = 2, "BlockRemoved"
        CLEARED = 3, "AllBlocksCleared"

    pk = models.CompositePrimaryKey(
        "server", "dp_rank", "epoch", "seq", "event_index", "block_index", "emitted_at"
    )
    # No index of its own: the primary key and kv_event_server_hash both start with server_id.
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+", db_index=False)
    dp_rank = models.SmallIntegerField(default=0)
    epoch = models.IntegerField(default=0)
    seq = models.BigIntegerField()
    event_index = models.SmallIntegerField(help_text="Position of the event in its batch")
    block_index = models.IntegerField(default=0, help_text="Position of the hash in the event")
    emitted_at = models.DateTimeField(help_text="The batch timestamp set by vLLM")
    received_at = models.DateTimeField()
    kind = models.SmallIntegerField(choices=Kind.choices)
    block_hash = UInt64Field(null=True, blank=True, help_text="Null for AllBlocksCleared")
    parent_hash = UInt64Field(null=True, blank=True)
    token_count = models.SmallIntegerField(null=True, blank=True)
    medium = models.CharField(max_length=20, blank=True)
    lora_name = models.CharField(max_length=255, blank=True)
    group_idx = models.SmallIntegerField(null=True, blank=True)

    class PartitioningMeta:
        method = PostgresPartitioningMethod.RANGE
        key = ["emitted_at"]

    class Meta:
        indexes = [models.Index(fields=["server", "block_hash"], name="kv_event_server_hash")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.block_hash} on {self.server_id}"


# Every record (its request id is never empty): the condition of the explorer's partial index, which
# the explorer's queries state so that PostgreSQL may use it (RequestRecord.Meta says why partial).
EXPLORER_ROWS = ~models.Q(request_id="")


def span_only_sql(alias: str) -> str:
    """SQL true for a record only vLLM's spans saw: no gateway, REST or application source said a
    thing a client sees (cached tokens from a usage block, the client's TTFT). Such a record is
    evidence (vLLM's own TTFT), not a request: when the same request reached Prefixscope from its
    client too, under another server name (spans without a server attribute), counting it would
    count the request twice. `source` is "otlp" only while no other source merged in."""
    return (
        f"({alias}.source = 'otlp' AND {alias}.cached_tokens IS NULL AND {alias}.client_ttft_seconds IS NULL)"
    )


class RequestRecord(PostgresPartitionedModel):
    """One inference request, joined from whichever sources saw it (gateway, spans, REST)."""

    class Source(models.TextChoices):
        GATEWAY = "gateway", "Gateway"
        OTLP = "otlp", "OTLP span"
        REST = "rest", "REST ingest"

    pk = models.CompositePrimaryKey("server", "request_id", "arrived_at")
    # No index of their own for the server and template keys: the primary key leads with the
    # server and request_template_time with the template. A lone server index was one more to
    # keep up on every insert, and the planner took it, scanning a whole day of a server's rows
    # per looked-up request, when a new partition had no statistics yet.
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+", db_index=False)
    request_id = models.CharField(
        max_length=records.REQUEST_ID_MAX,
        help_text="Canonical: the client's X-Request-Id, else vLLM's own (collectors/records.py)",
    )
    arrived_at = models.DateTimeField()
    trace_id = models.CharField(max_length=records.TRACE_ID_MAX, blank=True)
    model = models.CharField(max_length=records.MODEL_MAX, blank=True)
    tenant = models.CharField(max_length=records.TENANT_MAX, blank=True)
    template = models.ForeignKey(
        "prompts.Template", null=True, blank=True, on_delete=models.SET_NULL, db_index=False
    )
    template_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.SET_NULL
    )
    # Set for records without template metadata (app/prompts/models.py PrefixFamily). No database
    # constraint: a constraint added to this partitioned table is checked over every partition under
    # a lock that stops ingest, and then by a trigger per inserted row. No index either: nothing
    # looks records up by family yet, and every index is kept up on every insert. Families are never
    # deleted while records name them.
    family = models.ForeignKey(
        "prompts.PrefixFamily", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
        db_index=False, related_name="+",
    )  # fmt: skip
    source = models.CharField(max_length=10, choices=Source.choices)
    client_ttft_seconds = models.FloatField(
        null=True, blank=True, help_text="Time to first token as the client saw it (gateway, application)"
    )
    server_ttft_seconds = models.FloatField(
        null=True, blank=True, help_text="Time to first token as vLLM measured it (its llm_request span)"
    )
    queue_seconds = models.FloatField(null=True, blank=True)
    prefill_seconds = models.FloatField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    salt_hash = models.CharField(max_length=64, blank=True, help_text="sha256 of the cache salt, hex")
    # uint64 wire hashes stored as two's-complement bigints (see UInt64Field).
    block_hashes = ArrayField(models.BigIntegerField(), default=list, blank=True)
    # A salted prompt's chain without its salt, computed at ingest while its token ids are in hand:
    # the same tokens under another salt are then told from cold even in hash-only mode. [] unsalted.
    # A database default too: writers that name no such column (a process of the version before,
    # during a rolling upgrade) still store their rows.
    neutral_hashes = ArrayField(
        models.BigIntegerField(), default=list, blank=True, db_default=models.Value("{}")
    )
    # Prompt text in token form: null once PREFIXSCOPE_TOKEN_RETENTION_DAYS has passed or in hash-only mode.
    token_ids = ArrayField(models.IntegerField(), null=True, blank=True)

    class PartitioningMeta:
        method = PostgresPartitioningMethod.RANGE
        key = ["arrived_at"]

    class Meta:
        indexes = [
            models.Index(fields=["template", "arrived_at"], name="request_template_time"),
            models.Index(fields=["trace_id"], name="request_trace", condition=~models.Q(trace_id="")),
            # The requests explorer's keyset (app/traffic/explorer.py): newest first by the whole key,
            # read backwards, for any filter. Partial on a condition every record meets and only the
            # explorer's query states (EXPLORER_ROWS): the ingest's probe of (server, request id) near
            # a time must not take it over the primary key, as the planner may on a new day's
            # partition without statistics, and scan the window for every id
            # (tests/traffic/test_ingest_plan.py).
            models.Index(
                fields=["arrived_at", "server", "request_id"], name="request_time", condition=EXPLORER_ROWS
            ),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} on {self.server_id}"


def _next_id(table: str) -> models.Func:
    """The next value of a rollup table's own id sequence (migration 0018 made it).

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
    count TTFTs per vLLM TTFT histogram bucket, cumulative (app/traffic/services/rollups.py).
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

    Tenancy (app/core/tenancy.py Viewer.request_hours): these sums serve the servers the viewer's
    tenants own; the other servers' rows of its templates stay in HourRollup. Recomputed from the
    hour rollups whenever they are (app/traffic/services/rollups.py).
    """

    pk = models.CompositePrimaryKey("server", "hour")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="server_request_hour_time")]

    def __str__(self) -> str:
        return f"{self.server_id} {self.hour:%Y-%m-%d %H}h"


class LossTotals(models.Model):
    """Sums of the diagnoses (app/traffic/services/diagnosis.py) over one period per server,
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
            # Viewer.template_loss_hours), a few among the tenants' ones.
            models.Index(
                fields=["server", "hour"], name="loss_hour_untenanted", condition=models.Q(tenant="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.template_id}/{self.tenant} {self.hour:%Y-%m-%d %H}h"


class ServerLossHour(LossTotals):
    """The loss hours of one server and tenant summed over templates and versions: the fleet's lost
    tokens over a day or a week, a server having one tenant or a few, never x templates x versions.

    Tenancy (Viewer.loss_hours): these sums serve the rows of the viewer's tenants and the tenant-less
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

    Tenancy (app/core/tenancy.py Viewer.template_request_hours): these sums serve the templates the
    viewer's tenants own, every server's row of those being theirs; a shared template's sum holds other
    tenants' servers' rows, so its rows on the viewer's servers are read from HourRollup. Recomputed
    from the hour rollups whenever they are (app/traffic/services/rollups.py). No server: a small table
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

    Tenancy (Viewer.template_loss_hours): these sums serve the rows of the viewer's tenants and the
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

    Tenancy as ServerRequestHour's (Viewer.request_hours): the other servers' rows of a viewer's
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

    Tenancy as ServerLossHour's (Viewer.loss_hours): the tenant-less rows of a viewer's templates on
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
    periods add up; ratios and quantiles are taken of the sums (app/traffic/services/server_rollups.py).
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


class KVStream(models.Model):
    """Where the KV-event subscriber is in one server's stream (per data-parallel rank).

    Written in the same transaction as the events, so after a crash the subscriber asks the
    server's replay endpoint for everything after `last_seq` and nothing is stored twice.
    """

    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="kv_streams")
    dp_rank = models.SmallIntegerField(default=0)
    epoch = models.IntegerField(default=0, help_text="Raised each time the sequence restarts")
    last_seq = models.BigIntegerField()
    last_event_at = models.DateTimeField()
    # Running totals for /metrics (counters: they only grow). A thrash is a block stored again
    # within PREFIXSCOPE_THRASH_SECONDS of its removal (app/domain/thrash.py).
    blocks_stored = models.BigIntegerField(default=0, db_default=0)
    blocks_removed = models.BigIntegerField(default=0, db_default=0)
    blocks_thrashed = models.BigIntegerField(default=0, db_default=0)
    # The stream's rows in the block index (ResidentBlock), kept in step by the same statements that
    # write them: the Fleet page reads each server's resident share every load, and counting a fleet's
    # block index (servers x tens of thousands of blocks) there would grow with the GPUs.
    resident_blocks = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["server", "dp_rank"], name="kv_stream_identity")]

    def __str__(self) -> str:
        return f"{self.server_id}/rank {self.dp_rank} epoch {self.epoch} at {self.last_seq}"


class KVGap(models.Model):
    """Sequence numbers the subscriber missed; `lost` of them could not be replayed."""

    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    dp_rank = models.SmallIntegerField(default=0)
    epoch = models.IntegerField()
    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField()
    recovered = models.PositiveIntegerField(help_text="Batches the replay endpoint sent back")
    lost = models.PositiveIntegerField(help_text="Batches neither received nor replayed")
    detected_at = models.DateTimeField()

    class Meta:
        ordering = ["-detected_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["server", "dp_rank", "epoch", "first_seq"], name="kv_gap_identity"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id} seq {self.first_seq}-{self.last_seq}: {self.lost} lost"


class CollectorProcess(models.Model):
    """What a long-running collector process knows only in memory, reported every few seconds so
    that /metrics (served by any web process) can export it: the gateway's queue and spill file,
    the KV subscriber's buffered rows and leases. One row per process (host:pid) and name (a gateway
    has one per server it fronts), so that processes on one host never overwrite each other. A
    process that stops deletes its rows; a killed one's rows stay, silent, until another process of
    the same kind and name starts after them (its successor) or a day has passed
    (app/dashboard/metrics.py)."""

    class Kind(models.TextChoices):
        GATEWAY = "gateway", "Gateway"
        KV_SUBSCRIBER = "kv_subscriber", "KV-event subscriber"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    name = models.CharField(max_length=200, help_text="The gateway's server; the subscriber's host")
    process = models.CharField(max_length=100, default="", help_text="host:pid of the reporting process")
    started_at = models.DateTimeField(null=True, blank=True, help_text="When the process started")
    reported_at = models.DateTimeField()
    queue_depth = models.PositiveIntegerField(default=0, help_text="Records or rows waiting in memory")
    spill_bytes = models.PositiveBigIntegerField(default=0, help_text="Size of the gateway's spill file")
    leases_held = models.PositiveIntegerField(default=0, help_text="KV-event leases the subscriber holds")
    leases_taken = models.PositiveBigIntegerField(default=0, help_text="Leases taken since the start")
    leases_lost = models.PositiveBigIntegerField(
        default=0, help_text="Leases lost with a broken lease connection since the start"
    )
    leases_released = models.PositiveBigIntegerField(default=0, help_text="Leases given up since the start")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "name", "process"], name="collector_process_identity")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.process})"


class ResidentBlock(models.Model):
    """The block index: blocks a server holds now (stored minus removed, emptied on a clear)."""

    pk = models.CompositePrimaryKey("server", "dp_rank", "block_hash")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    dp_rank = models.SmallIntegerField(default=0)
    block_hash = UInt64Field()
    parent_hash = UInt64Field(null=True, blank=True)
    stored_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.block_hash} on {self.server_id}/{self.dp_rank}"


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


class RejectedInput(models.Model):
    """Malformed input, counted per server, source and reason; the good data around it is kept."""

    server = models.ForeignKey("fleet.Server", null=True, blank=True, on_delete=models.CASCADE)
    source = models.CharField(max_length=20, help_text="kv_events, metrics, otlp, rest, gateway")
    reason = models.CharField(max_length=300)
    count = models.PositiveBigIntegerField(default=0)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["server", "source", "reason"], name="rejected_input_identity", nulls_distinct=False
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source}: {self.reason} x{self.count}"


# The prompt tokens a diagnosis lost that a cache could have reused: every cause's but the tail below
# one block. The recent misses are ordered by it and the index they walk (diagnosis_reusable_lost) is
# built from it: one expression, so that PostgreSQL matches the two (tests/traffic/test_recent_misses.py
# checks it lists every RequestDiagnosis.Cause but below_block).
REUSABLE_LOST_COLUMNS = (
    "prompt_changed_tokens", "evicted_tokens", "routed_elsewhere_tokens", "salt_tokens", "restarted_tokens",
    "cold_tokens", "unexplained_tokens", "no_kv_events_tokens",
)  # fmt: skip
REUSABLE_LOST = reduce(operator.add, [models.F(column) for column in REUSABLE_LOST_COLUMNS])


class RequestDiagnosis(PostgresPartitionedModel):
    """Why one request record's prompt tokens were not reused (app/domain/misscauses.py), and its
    funnel; keyed as its record. Derived: written once per record by the diagnosis task."""

    class Cause(models.TextChoices):
        PROMPT_CHANGED = "prompt_changed", "Prompt changed"
        EVICTED = "evicted", "Evicted"
        ROUTED_ELSEWHERE = "routed_elsewhere", "Routed elsewhere"
        SALT = "salt", "Tenant salt"
        RESTARTED = "restarted", "Server restarted"
        BELOW_BLOCK = "below_block", "Shorter than one block"
        COLD = "cold", "Cold (never seen)"
        UNEXPLAINED = "unexplained", "Unexplained (resident, still missed)"
        NO_KV_EVENTS = "no_kv_events", "No KV events from this server"

    class Unknown(models.TextChoices):
        NO_PROMPT = "no_prompt", "No prompt token ids (a span alone)"
        NO_CACHED_TOKENS = "no_cached_tokens", "Cached tokens not reported"
        NO_BLOCK_SIZE = "no_block_size", "Block size of the server unknown"
        SPAN_ONLY = "span_only", "Seen in vLLM's span alone: not counted as a request"

    pk = models.CompositePrimaryKey("server", "request_id", "arrived_at")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+", db_index=False)
    request_id = models.CharField(max_length=records.REQUEST_ID_MAX)
    arrived_at = models.DateTimeField()
    diagnosed_at = models.DateTimeField()
    template = models.ForeignKey(
        "prompts.Template", null=True, blank=True, on_delete=models.SET_NULL, db_index=False
    )
    template_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.SET_NULL, db_index=False
    )
    tenant = models.CharField(max_length=records.TENANT_MAX, blank=True)
    # The cause that lost the most reusable tokens ("" when none was lost); or why no diagnosis.
    cause = models.CharField(max_length=20, choices=Cause.choices, blank=True)
    unknown = models.CharField(max_length=20, choices=Unknown.choices, blank=True)
    diverged_at = models.PositiveIntegerField(null=True, blank=True, help_text="prompt_changed: first token")
    unexpected_hit = models.BooleanField(default=False)
    # The funnel, in leading prompt tokens.
    prompt_tokens = models.PositiveIntegerField(default=0)
    seen_before_tokens = models.PositiveIntegerField(default=0)
    resident_anywhere_tokens = models.PositiveIntegerField(default=0)
    resident_here_tokens = models.PositiveIntegerField(default=0)
    reused_tokens = models.PositiveIntegerField(default=0)
    # Lost tokens by cause: one column each, so that rollups are sums.
    prompt_changed_tokens = models.PositiveIntegerField(default=0)
    evicted_tokens = models.PositiveIntegerField(default=0)
    routed_elsewhere_tokens = models.PositiveIntegerField(default=0)
    salt_tokens = models.PositiveIntegerField(default=0)
    restarted_tokens = models.PositiveIntegerField(default=0)
    below_block_tokens = models.PositiveIntegerField(default=0)
    cold_tokens = models.PositiveIntegerField(default=0)
    unexplained_tokens = models.PositiveIntegerField(default=0)
    no_kv_events_tokens = models.PositiveIntegerField(default=0)
    # Each run of blocks lost to one cause: first token, tokens, and where it applies the server,
    # the tokens that server held, when the block was stored and removed.
    losses = models.JSONField(default=list, blank=True)

    class PartitioningMeta:
        method = PostgresPartitioningMethod.RANGE
        key = ["arrived_at"]

    class Meta:
        indexes = [
            models.Index(fields=["template", "arrived_at"], name="diagnosis_template_time"),
            # The tenant audit lists them; they are rare, so a partial index stays small.
            models.Index(
                fields=["arrived_at"],
                condition=models.Q(unexpected_hit=True),
                name="diagnosis_unexpected_hits",
            ),
            # The Fleet page's recent misses, most reusable tokens lost first then newest: the index of
            # each partition of the window read from its top, merged, stopped at the limit (a few dozen
            # entries, not the hour's tens of thousands of rows sorted).
            models.Index(REUSABLE_LOST.desc(), models.F("arrived_at").desc(), name="diagnosis_reusable_lost"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} on {self.server_id}: {self.cause or self.unknown or 'reused'}"

    @property
    def changed_from(self) -> int | None:
        """Where its prompt-changed loss starts, as lists say it: `diverged_at` (token-exact, against
        its template's earlier prompts under its salt), unless that lies in a block lost to another
        cause (a salted request's first block, whose tokens another salt had): then the first token of
        its prompt-changed loss, so that the tokens said changed are never those said lost to the salt."""
        if self.diverged_at is None:
            return None
        starts = [loss["first_token"] for loss in self.losses if loss["cause"] == self.Cause.PROMPT_CHANGED]
        return max(self.diverged_at, starts[0]) if starts else self.diverged_at


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
