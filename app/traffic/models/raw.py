"""Raw traffic as collected: scrapes, KV events and request records.

The three raw tables are partitioned by day (app/traffic/services/partitions.py). Their primary
keys are the natural identity of what arrives, server first, so that a redelivered scrape,
event or request is written once (ON CONFLICT DO NOTHING / COPY into a staging table), and so
that Citus could shard them by server unchanged.
"""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from psqlextra.models import PostgresPartitionedModel
from psqlextra.types import PostgresPartitioningMethod

from app.core.fields import UInt64Field
from app.domain.tiers import RemovalReason
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
    # BlockRemoved's reason where the engine says it (SGLang #39620; app/domain/tiers.py RemovalReason):
    # a request's own blocks freed as it ended take no cached block away.
    removal_reason = models.SmallIntegerField(
        null=True, blank=True, choices=[(r.value, r.name.lower()) for r in RemovalReason],
        help_text="BlockRemoved: why, as the engine said; blank: not said",
    )  # fmt: skip

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
    # Hosted APIs (app/domain/hosted.py). Their records have no token ids: `block_hashes` then holds
    # the chain of the prompt's content-block digests (app.domain.hosted.content_chain), one entry a
    # block. Database defaults: a writer of the version before names none of these columns.
    provider = models.CharField(
        max_length=20, blank=True, db_default="", default="", help_text="Hosted API; blank: self-hosted"
    )
    cache_write_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="Written to a hosted provider's cache (Anthropic, Bedrock)"
    )
    cache_ttl_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="The longest TTL of those writes (5m, 1h); null: not reported"
    )
    cache_key_hash = models.CharField(
        max_length=64, blank=True, db_default="", default="", help_text="sha256 of prompt_cache_key, hex"
    )
    cache_breakpoints = ArrayField(
        models.IntegerField(), null=True, blank=True, help_text="Content blocks with a cache marker"
    )
    gateway_cache_hit = models.BooleanField(
        null=True, blank=True, help_text="Answered by a gateway's response (semantic) cache"
    )
    # The gateway's keyed digests of a chat request's parts (collectors/parts.py PartDigests), never
    # their text: what the diagnosis compares to say which part of a changed prompt changed.
    part_digests = models.JSONField(null=True, blank=True)

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
