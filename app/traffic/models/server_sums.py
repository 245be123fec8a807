"""The sums of a server's own readings per period: its /metrics pulls and KV events by the minute
and the hour (app/rollups/ keeps them)."""

from django.contrib.postgres.fields import ArrayField
from django.db import models


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
