from django.conf import settings
from django.db import models

from app.domain.misses import HIT_RATE_DEFINITIONS
from app.regressions.series import HIT_RATE_DEFINITION
from collectors import records


class Regression(models.Model):
    """A drop in one scope's hit rate (of what it could reuse: hit_rate_definition), or a rise in its
    TTFT p90 (app/domain/changepoints.py found it in the per-minute rollups), what caused it, and
    what it costs while it lasts.

    One row per scope and change point: online detection and a backfill over history
    (`manage.py detect_regressions`) find the same change at the same minute, so they write one row.
    """

    class Scope(models.TextChoices):
        TEMPLATE = "template", "Template"
        TEMPLATE_SERVER = "template_server", "Template on a server"
        TEMPLATE_TENANT = "template_tenant", "Template for a tenant"
        SERVER = "server", "Server"
        TENANT = "tenant", "Tenant"
        FLEET = "fleet", "Fleet"

    class Metric(models.TextChoices):
        HIT_RATE = "hit_rate", "Hit rate"
        TTFT = "ttft", "TTFT p90"

    class Kind(models.TextChoices):
        """What the change is attributed to (app/regressions/attribution.py)."""

        TEMPLATE_COMMIT = "template_commit", "Template commit"
        CAPACITY = "capacity", "Capacity drop"
        ROUTING = "routing", "Routing change"
        SALT_ROTATION = "salt_rotation", "Salt rotation"
        RESTART = "restart", "Restart"
        UNKNOWN = "unknown", "Unknown"

    class Resolution(models.TextChoices):
        """Why the detection resolved it (app/regressions/services.py)."""

        RECOVERED = "recovered", "Recovered"
        REVERTED = "reverted", "Version reverted"
        IDLE = "idle", "Scope idle"

    class State(models.TextChoices):
        OPEN = "open", "Open"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"
        MUTED = "muted", "Muted"
        RESOLVED = "resolved", "Resolved"

    scope = models.CharField(max_length=20, choices=Scope.choices)
    template = models.ForeignKey("prompts.Template", null=True, blank=True, on_delete=models.CASCADE)
    server = models.ForeignKey("fleet.Server", null=True, blank=True, on_delete=models.CASCADE)
    tenant = models.CharField(max_length=records.TENANT_MAX, blank=True)
    metric = models.CharField(max_length=10, choices=Metric.choices, default=Metric.HIT_RATE)
    changed_at = models.DateTimeField(help_text="The first minute after the change point")
    detected_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=10, choices=Resolution.choices, blank=True)

    rate_before = models.FloatField()
    rate_after = models.FloatField()
    rate_now = models.FloatField(help_text="Over the last minutes, as of updated_at")
    requests_before = models.PositiveIntegerField()
    requests_after = models.PositiveIntegerField(help_text="Since the change, as of updated_at")
    confidence = models.FloatField()
    # TTFT regressions (metric ttft): the p90 in seconds; rate_* are then the scope's hit rate over
    # the same minutes, for context.
    ttft_before_seconds = models.FloatField(null=True, blank=True, help_text="p90, geometric mean per minute")
    ttft_after_seconds = models.FloatField(null=True, blank=True)
    ttft_now_seconds = models.FloatField(null=True, blank=True, help_text="p90 of the last minutes")
    method = models.JSONField(default=dict, help_text="The detection method, its parameters and figures")

    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.UNKNOWN)
    expected = models.BooleanField(default=False, help_text="Transient by nature: closes once warm again")
    suspect_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    candidates = models.JSONField(default=list, blank=True, help_text="Suspects, best first, with scores")
    cause_shift = models.JSONField(
        default=dict, blank=True, help_text="Lost tokens' causes, before and after"
    )
    evidence = models.JSONField(
        default=dict,
        blank=True,
        help_text="A before/after pair of requests, its divergence and Compare permalink",
    )

    # Its cost over the window since its change (app/regressions/cost.py): the headline, what reverting
    # or fixing it wins back, and the whole of its scope's lost tokens that the headline is part of.
    lost_tokens_per_hour = models.FloatField(
        default=0, help_text="Prefill tokens an hour lost over what its scope lost at its rate before"
    )
    scope_lost_tokens_per_hour = models.FloatField(
        default=0, help_text="All its scope's lost tokens an hour over the same window: its pages' figure"
    )
    prefill_tokens_per_second = models.FloatField(default=0)
    prefill_rate_source = models.CharField(max_length=20, blank=True, help_text="measured or configured")
    gpu_seconds_per_hour = models.FloatField(default=0)
    cost_per_hour = models.FloatField(default=0, help_text="At PREFIXSCOPE_GPU_HOUR_PRICE")

    state = models.CharField(max_length=15, choices=State.choices, default=State.OPEN)
    note = models.TextField(blank=True)
    noted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-changed_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "template", "server", "tenant", "metric", "changed_at"],
                name="regression_identity",
                nulls_distinct=False,
            ),
        ]
        indexes = [models.Index(fields=["state", "scope"], name="regression_state")]

    def __str__(self) -> str:
        if self.metric == self.Metric.TTFT:
            before, after = self.ttft_before_seconds or 0.0, self.ttft_after_seconds or 0.0
            return f"{self.scope} {self.scope_label}: TTFT p90 {before:.3f} s -> {after:.3f} s"
        return f"{self.scope} {self.scope_label}: {self.rate_before:.0%} -> {self.rate_after:.0%}"

    @property
    def scope_label(self) -> str:
        """The template's, server's or tenant's name; "fleet" for the whole fleet."""
        if self.scope == self.Scope.TEMPLATE and self.template is not None:
            return self.template.name
        if self.scope == self.Scope.TEMPLATE_SERVER and self.template is not None and self.server is not None:
            return f"{self.template.name} on {self.server.name}"
        if self.scope == self.Scope.TEMPLATE_TENANT and self.template is not None:
            return f"{self.template.name} for {self.tenant or '(no tenant)'}"
        if self.scope == self.Scope.SERVER and self.server is not None:
            return self.server.name
        if self.scope == self.Scope.TENANT:
            return self.tenant or "(no tenant)"
        return "fleet"

    @property
    def hit_rate_definition(self) -> str:
        """What its rates (before, after, now) are the share of: the scope's series' definition
        (app/regressions/series.py), or the recorded rate over a TTFT regression's minutes."""
        name = "recorded" if self.metric == self.Metric.TTFT else HIT_RATE_DEFINITION[self.scope]
        return HIT_RATE_DEFINITIONS[name]

    @property
    def kind_label(self) -> str:
        """Its kind as the pages name it. A TTFT rise is opened only when the prefix cache's misses
        did not rise with it (app/regressions/ttft.py): one no commit explains says so, rather
        than "Unknown"."""
        if self.metric != self.Metric.TTFT:
            return self.get_kind_display()
        if self.kind == self.Kind.UNKNOWN:
            return "TTFT rose, not the cache: no cause found"
        return f"TTFT rose: {self.get_kind_display().lower()}"

    @property
    def is_active(self) -> bool:
        return self.state != self.State.RESOLVED
