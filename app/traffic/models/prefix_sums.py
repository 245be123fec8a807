"""What the salt audit reads: the cache salts each tenant's requests carried, and the unsalted
requests' first blocks summed per minute and hour (app/rollups/ keeps them)."""

from django.db import models

from collectors import records


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
