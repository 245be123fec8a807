from django.db import models


class Regression(models.Model):
    """A change point in a template's hit rate or TTFT, with its suspect version and cost."""

    class Metric(models.TextChoices):
        HIT_RATE = "hit_rate", "Hit rate"
        TTFT = "ttft", "TTFT"

    class State(models.TextChoices):
        OPEN = "open", "Open"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"
        RESOLVED = "resolved", "Resolved"

    template = models.ForeignKey("prompts.Template", null=True, blank=True, on_delete=models.CASCADE)
    server = models.ForeignKey("fleet.Server", null=True, blank=True, on_delete=models.CASCADE)
    metric = models.CharField(max_length=10, choices=Metric.choices)
    changed_at = models.DateTimeField(help_text="The change point")
    before_value = models.FloatField()
    after_value = models.FloatField()
    suspect_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.SET_NULL
    )
    # The version diff, a before/after prompt pair (by request key) and its divergence.
    evidence = models.JSONField(default=dict, blank=True)
    extra_prefill_tokens_per_hour = models.FloatField(default=0)
    gpu_seconds_per_hour = models.FloatField(default=0)
    state = models.CharField(max_length=15, choices=State.choices, default=State.OPEN)
    detected_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-changed_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["template", "server", "metric", "changed_at"],
                name="regression_identity",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        change = f"{self.before_value:.3g} -> {self.after_value:.3g}"
        return f"{self.get_metric_display()} {change} at {self.changed_at}"
