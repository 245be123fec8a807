from datetime import timedelta

from django.db import models

from app.domain.hitblock import HitBlock, effective_block
from app.domain.tiers import attention_group


def kv_group_kinds(groups: object) -> dict[int, str | None]:
    """The kind of each KV-cache group of a server's `kv_cache_groups` ({group: {kind, block_size}},
    as its events named them), by group index; entries of another shape are left out."""
    if not isinstance(groups, dict):
        return {}
    return {
        int(group): str(found.get("kind") or "") or None
        for group, found in groups.items()
        if isinstance(group, str) and group.isdigit() and isinstance(found, dict)
    }


class Server(models.Model):
    """One vLLM endpoint; block size and hash algorithm are discovered from its /metrics."""

    class State(models.TextChoices):
        PROPOSED = "proposed", "Proposed"  # seen in ingested data, not registered by a person
        ACTIVE = "active", "Active"
        DOWN = "down", "Down"  # its last scrape failed
        DISABLED = "disabled", "Disabled"

    name = models.SlugField(max_length=100, unique=True)
    base_url = models.URLField(help_text="OpenAI-compatible API root, e.g. http://vllm-0:8000")
    metrics_url = models.URLField(blank=True, help_text="Defaults to <base_url>/metrics")
    kv_events_endpoint = models.CharField(max_length=255, blank=True, help_text="ZMQ PUB, tcp://host:5557")
    kv_replay_endpoint = models.CharField(max_length=255, blank=True, help_text="ZMQ ROUTER, tcp://host:5558")
    kv_topic = models.CharField(max_length=255, blank=True)
    model = models.CharField(max_length=255, blank=True)
    block_size = models.PositiveIntegerField(null=True, blank=True)
    num_gpu_blocks = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="KV blocks of one engine, vLLM's null block included (cache_config_info)",
    )
    hash_algo = models.CharField(max_length=50, blank=True)
    # The granularity of a hit where it is coarser than block_size (app/domain/hitblock.py): what
    # cache_config_info states (its alignment, else its attention and Mamba block sizes), and the
    # KV-cache groups its events name.
    stated_hit_block = models.PositiveIntegerField(
        null=True, blank=True, help_text="Hit granularity per cache_config_info, in tokens; blank: not stated"
    )
    # Database defaults too: a writer of the version before (a rolling upgrade) names neither.
    kv_cache_groups = models.JSONField(
        default=dict, db_default={}, blank=True,
        help_text="KV-cache groups its events name, {group: {kind, block_size}}",
    )  # fmt: skip
    drops_last_block = models.BooleanField(
        default=False, db_default=False,
        help_text="Speculative decoding (EAGLE/MTP) on: vLLM drops the last matched block",
    )  # fmt: skip
    tenant = models.CharField(
        max_length=100, blank=True, help_text="Tenant whose users may see it; blank: all"
    )
    # Alerts about the server's capacity, restarts and KV stream carry it as their owner, so that an
    # Alertmanager route sends them to the team that can add memory or restart it.
    group = models.SlugField(
        max_length=100,
        default="platform",
        db_default="platform",
        help_text="The team that runs it: its alerts are routed to it",
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    scrape_interval_seconds = models.PositiveIntegerField(default=15)
    last_scraped_at = models.DateTimeField(null=True, blank=True)
    next_scrape_at = models.DateTimeField(
        null=True, blank=True, help_text="When the dispatcher sends the next pull"
    )
    discovered_at = models.DateTimeField(null=True, blank=True, help_text="When block size was last read")
    # From /v1/models: vLLM hashes a LoRA adapter's name and path into its requests' blocks.
    base_models = models.JSONField(
        default=list, blank=True, help_text="The names the base model is served under, per /v1/models"
    )
    lora_adapters = models.JSONField(
        default=dict, blank=True, help_text="LoRA adapters served, {name: path}, per /v1/models"
    )
    models_read_at = models.DateTimeField(null=True, blank=True, help_text="When /v1/models was last read")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(block_size__isnull=True) | models.Q(block_size__gt=0),
                name="server_block_size_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def hit_block(self) -> HitBlock | None:
        """How its prefix cache rounds a hit; None while its block size is unknown."""
        if not self.block_size:
            return None
        groups = [g.get("block_size") or 0 for g in self.kv_cache_groups.values() if isinstance(g, dict)]
        size = effective_block(self.block_size, stated=self.stated_hit_block, groups=groups)
        return HitBlock(self.block_size, size, self.drops_last_block)

    @property
    def attention_group(self) -> int:
        """The KV-cache group its prefix is reused from: the full-attention one its events named
        (app/domain/tiers.py attention_group); 0 while they named none."""
        return attention_group(kv_group_kinds(self.kv_cache_groups))

    @property
    def scrape_interval_timedelta(self) -> timedelta:
        return timedelta(seconds=self.scrape_interval_seconds)

    @property
    def effective_metrics_url(self) -> str:
        return self.metrics_url or self.base_url.rstrip("/") + "/metrics"

    @property
    def models_url(self) -> str:
        return self.base_url.rstrip("/") + "/v1/models"


class ServerAlias(models.Model):
    """The name of a proposed server a person merged into a registered one: data naming it later
    (vLLM's spans without a server attribute name their ingest token) is the registered server's,
    instead of proposing the merged server anew."""

    name = models.SlugField(max_length=100, unique=True)
    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="aliases")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name} -> {self.server_id}"
