"""The collectors' own state: KV streams and their gaps, collector processes, the resident
blocks of each server, and the tally of rejected input."""

from django.db import models

from app.core.fields import UInt64Field


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
    (app/dashboard/metrics/collector.py)."""

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


class RejectedInput(models.Model):
    """Malformed input, counted per server, source and reason code; the good data around it is kept.

    `reason` is one of a fixed set of codes (collectors/errors.py RejectReason): it is a label of
    /metrics, and free text there is a series per message. `detail` is the latest rejection's own
    message (which field, what was expected), for the pages only."""

    server = models.ForeignKey("fleet.Server", null=True, blank=True, on_delete=models.CASCADE)
    source = models.CharField(max_length=20, help_text="kv_events, metrics, otlp, rest, gateway")
    # No choices: a new code needs no migration; the writer takes RejectReason members only.
    reason = models.CharField(max_length=40, help_text="A RejectReason code (collectors/errors.py)")
    detail = models.CharField(
        max_length=300, blank=True, default="", help_text="The latest rejection's message"
    )
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


class UndecodableSample(models.Model):
    """The first bytes of a KV payload or event that could not be decoded: the newest few per server
    and reason, for a person to see what the engine sent. Raw bytes can hold token ids (prompt
    text): kept only while token ids are (app/core/retention.py), shown to staff and the server's
    owners only, never logged."""

    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=40, help_text="A RejectReason code (collectors/errors.py)")
    seen_at = models.DateTimeField()
    head = models.BinaryField(help_text="Up to the first 64 bytes of what was refused")

    class Meta:
        indexes = [models.Index(fields=["server", "reason", "-seen_at"], name="undecodable_sample_newest")]

    def __str__(self) -> str:
        return f"{self.server_id} {self.reason} @ {self.seen_at}"


class RecordsReceived(models.Model):
    """Request records each source stored per server since its first: a counter for /metrics, read
    beside the engine's own request counter (a source that stopped while the engine still served).

    A record's row keeps only the first source that sent it (RequestRecord.source), so arrivals are
    counted here, one upsert per stored batch. A (server, source) without a row never sent one."""

    pk = models.CompositePrimaryKey("server", "source")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    source = models.CharField(max_length=20, help_text="A RequestRecord.Source: gateway, otlp, rest")
    count = models.PositiveBigIntegerField(default=0)
    first_received_at = models.DateTimeField()
    last_received_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.server_id} {self.source}: {self.count}"
