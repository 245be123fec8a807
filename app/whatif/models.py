from django.conf import settings
from django.db import models


class WhatIfQuestion(models.Model):
    """A what-if asked of a scope and window, and its answers once the task has run (kept, so a
    result can be read again and linked to; app/whatif/services.py computes it)."""

    class Scope(models.TextChoices):
        FLEET = "fleet", "Fleet"
        GROUP = "group", "Server group"
        TEMPLATE = "template", "Template"

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    scope = models.CharField(max_length=10, choices=Scope.choices)
    name = models.CharField(
        max_length=200, blank=True, help_text="The group's or template's; '' for the fleet"
    )
    since = models.DateTimeField()
    until = models.DateTimeField()
    # The tenants the asker sees (None: all): the answers count their requests only.
    tenants = models.JSONField(null=True, blank=True)
    asked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0, help_text="0 to 1 while it runs")
    error = models.TextField(blank=True, help_text="Why it failed, for the asker (never prompt content)")
    # app/whatif/results.py writes and reads it: the domain's WhatIf as plain JSON.
    answers = models.JSONField(null=True, blank=True)
    asked_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["scope", "name", "-asked_at"], name="whatif_scope_recent")]

    def __str__(self) -> str:
        return f"what-if of {self.scope} {self.name} {self.since:%Y-%m-%d %H:%M}-{self.until:%H:%M}"
