"""Saved comparisons of two prompts: what was compared, never the result (the engine recomputes it).

A side is a recorded request (its key: request records have a composite key, so no foreign key)
or a pasted prompt, whose token ids are prompt text: they are stored only while the token
retention setting allows, like a request record's.
"""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.urls import reverse


class Comparison(models.Model):
    """A permalink to a comparison of a cached prompt (side a) and a later one (side b)."""

    slug = models.SlugField(max_length=16, unique=True)
    block_size = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(block_size__gt=0), name="comparison_block_size_positive"
            ),
        ]
        indexes = [models.Index(fields=["created_at"], name="comparison_created")]

    def __str__(self) -> str:
        return self.slug

    def get_absolute_url(self) -> str:
        return reverse("compare:detail", kwargs={"slug": self.slug})


class ComparisonSide(models.Model):
    """One side of a comparison as it was given, with the compatibility record it was compared under."""

    class Source(models.TextChoices):
        RECORD = "record", "Recorded request"
        TEXT = "text", "Text"
        CHAT = "chat", "Chat messages"
        TOKEN_IDS = "token_ids", "Token ids"

    class Letter(models.TextChoices):
        A = "a", "A (cached first)"
        B = "b", "B (later)"

    comparison = models.ForeignKey(Comparison, on_delete=models.CASCADE, related_name="sides")
    side = models.CharField(max_length=1, choices=Letter.choices)
    source = models.CharField(max_length=10, choices=Source.choices)
    # A recorded request's server; for a prompt, the server whose /tokenize was used (if any).
    server = models.ForeignKey(
        "fleet.Server", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    request_id = models.CharField(max_length=255, blank=True)
    arrived_at = models.DateTimeField(null=True, blank=True)
    # Prompt text in token form (pasted prompts only): null once PREFIXSCOPE_TOKEN_RETENTION_DAYS has passed.
    token_ids = ArrayField(models.IntegerField(), null=True, blank=True)
    token_strs = ArrayField(models.TextField(), null=True, blank=True)
    tokenizer_used = models.CharField(max_length=300, blank=True)
    tokenizer_warning = models.TextField(blank=True)
    compatibility = models.JSONField(help_text="app.domain.divergence.Compatibility fields")

    class Meta:
        ordering = ["comparison", "side"]
        constraints = [
            models.UniqueConstraint(fields=["comparison", "side"], name="comparison_side_identity"),
        ]

    def __str__(self) -> str:
        return f"{self.comparison_id}/{self.side}: {self.source}"

    @property
    def summary(self) -> str:
        """``request <id>`` or ``pasted text`` (no prompt text)."""
        if self.source == self.Source.RECORD:
            return f"request {self.request_id}"
        return f"pasted {self.get_source_display().lower()}"
