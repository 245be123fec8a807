"""A request's diagnosis: why its prompt tokens were not reused, keyed as its record."""

import operator
from functools import reduce

from django.db import models
from psqlextra.models import PostgresPartitionedModel
from psqlextra.types import PostgresPartitioningMethod

from app.domain.misses import CAUSE_LABELS, PART_LABELS, UNKNOWN_LABELS, Loss, is_loss
from app.domain.misses import Cause as _Cause
from app.domain.misses import RequestPart as _Part
from app.domain.misses import Unknown as _Unknown
from app.domain.requestparts import change_text
from collectors import records

# The prompt tokens a diagnosis lost that a cache could have reused: every cause's that is a loss
# (app/domain/misses.py NOT_LOSSES says which are not). The recent misses are ordered by it and the
# index they walk (diagnosis_reusable_lost) is built from it: one expression, so that PostgreSQL
# matches the two (tests/traffic/test_recent_misses.py checks it).
REUSABLE_LOST_COLUMNS = tuple(f"{cause.value}_tokens" for cause in _Cause if is_loss(cause))
REUSABLE_LOST = reduce(operator.add, [models.F(column) for column in REUSABLE_LOST_COLUMNS])
# And what no cache could have reused (new content, the tail below one block ...): a prompt's tokens
# less these are its reusable ones (app/domain/misses.py OF_REUSABLE).
NEVER_REUSABLE = reduce(
    operator.add, [models.F(f"{cause.value}_tokens") for cause in _Cause if not is_loss(cause)]
)


class RequestDiagnosis(PostgresPartitionedModel):
    """Why one request record's prompt tokens were not reused (app/domain/misscauses.py), and its
    funnel; keyed as its record. Derived: written once per record by the diagnosis task."""

    # The domain's causes and reasons with their labels, member by member (the functional form,
    # built from the domain's enum, is not one django-stubs types): tests/diagnosis/test_shape.py
    # checks that every member of the domain has one here.
    class Cause(models.TextChoices):
        PROMPT_CHANGED = _Cause.PROMPT_CHANGED.value, CAUSE_LABELS[_Cause.PROMPT_CHANGED]
        EVICTED = _Cause.EVICTED.value, CAUSE_LABELS[_Cause.EVICTED]
        ROUTED_ELSEWHERE = _Cause.ROUTED_ELSEWHERE.value, CAUSE_LABELS[_Cause.ROUTED_ELSEWHERE]
        SALT = _Cause.SALT.value, CAUSE_LABELS[_Cause.SALT]
        RESTARTED = _Cause.RESTARTED.value, CAUSE_LABELS[_Cause.RESTARTED]
        BELOW_BLOCK = _Cause.BELOW_BLOCK.value, CAUSE_LABELS[_Cause.BELOW_BLOCK]
        COLD = _Cause.COLD.value, CAUSE_LABELS[_Cause.COLD]
        UNEXPLAINED = _Cause.UNEXPLAINED.value, CAUSE_LABELS[_Cause.UNEXPLAINED]
        NO_KV_EVENTS = _Cause.NO_KV_EVENTS.value, CAUSE_LABELS[_Cause.NO_KV_EVENTS]
        NEW_CONTENT = _Cause.NEW_CONTENT.value, CAUSE_LABELS[_Cause.NEW_CONTENT]
        DEMOTED = _Cause.DEMOTED.value, CAUSE_LABELS[_Cause.DEMOTED]
        BELOW_MINIMUM = _Cause.BELOW_MINIMUM.value, CAUSE_LABELS[_Cause.BELOW_MINIMUM]
        TTL_LAPSED = _Cause.TTL_LAPSED.value, CAUSE_LABELS[_Cause.TTL_LAPSED]
        BEYOND_LOOKBACK = _Cause.BEYOND_LOOKBACK.value, CAUSE_LABELS[_Cause.BEYOND_LOOKBACK]
        MARKER_ABSENT = _Cause.MARKER_ABSENT.value, CAUSE_LABELS[_Cause.MARKER_ABSENT]
        CACHE_KEY_CHANGED = _Cause.CACHE_KEY_CHANGED.value, CAUSE_LABELS[_Cause.CACHE_KEY_CHANGED]

    class Part(models.TextChoices):
        SYSTEM = _Part.SYSTEM.value, PART_LABELS[_Part.SYSTEM]
        TOOLS = _Part.TOOLS.value, PART_LABELS[_Part.TOOLS]
        TOOL_CHOICE = _Part.TOOL_CHOICE.value, PART_LABELS[_Part.TOOL_CHOICE]
        RESPONSE_FORMAT = _Part.RESPONSE_FORMAT.value, PART_LABELS[_Part.RESPONSE_FORMAT]
        REASONING_EFFORT = _Part.REASONING_EFFORT.value, PART_LABELS[_Part.REASONING_EFFORT]
        TEMPLATE_KWARGS = _Part.TEMPLATE_KWARGS.value, PART_LABELS[_Part.TEMPLATE_KWARGS]
        HISTORY = _Part.HISTORY.value, PART_LABELS[_Part.HISTORY]
        MESSAGES = _Part.MESSAGES.value, PART_LABELS[_Part.MESSAGES]
        MODEL = _Part.MODEL.value, PART_LABELS[_Part.MODEL]
        ADAPTER = _Part.ADAPTER.value, PART_LABELS[_Part.ADAPTER]

    class Unknown(models.TextChoices):
        NO_PROMPT = _Unknown.NO_PROMPT.value, UNKNOWN_LABELS[_Unknown.NO_PROMPT]
        NO_CACHED_TOKENS = _Unknown.NO_CACHED_TOKENS.value, UNKNOWN_LABELS[_Unknown.NO_CACHED_TOKENS]
        NO_BLOCK_SIZE = _Unknown.NO_BLOCK_SIZE.value, UNKNOWN_LABELS[_Unknown.NO_BLOCK_SIZE]
        # Not the domain's: the record is not one a diagnosis reads (app/diagnosis/run.py).
        SPAN_ONLY = "span_only", "Seen in vLLM's span alone: not counted as a request"
        # Its server reported no hit while repeats got much faster (app/domain/hitcounter.py): its
        # cached tokens say nothing, so its tokens are not called lost.
        COUNTER_NOT_WIRED = "counter_not_wired", "Hit counter not wired: repeats got faster, no hit reported"
        # Answered by a gateway's response (semantic) cache: the model never saw it, so no prefix
        # was reused or missed; counted apart, never as reuse (collectors.usage.parse.gateway_cache_hit).
        GATEWAY_CACHE = "gateway_cache", "Answered by a gateway's semantic cache: no prefix reuse"

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
    changed_part = models.CharField(
        max_length=20,
        choices=Part.choices,
        blank=True,
        help_text="prompt_changed: the request's part",
        default="",
        db_default="",  # writers that name no such column (an older process, a bulk INSERT) store ""
    )
    part_detail = models.CharField(
        max_length=20,
        blank=True,
        default="",
        db_default="",
        help_text="changed_part tools: added, removed, edited, reordered, re-serialized",
    )
    compared_with = models.CharField(
        max_length=records.REQUEST_ID_MAX, blank=True, default="", db_default="",
        help_text="prompt_changed: the request id of the earlier request its parts were compared with",
    )  # fmt: skip
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
    new_content_tokens = models.PositiveIntegerField(default=0)
    demoted_tokens = models.PositiveIntegerField(default=0)
    below_minimum_tokens = models.PositiveIntegerField(default=0)
    ttl_lapsed_tokens = models.PositiveIntegerField(default=0)
    beyond_lookback_tokens = models.PositiveIntegerField(default=0)
    marker_absent_tokens = models.PositiveIntegerField(default=0)
    cache_key_changed_tokens = models.PositiveIntegerField(default=0)
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
    def change_text(self) -> str:
        """The changed part as pages say it ("tools reordered"); "" when not known."""
        return change_text(self.changed_part, self.part_detail)

    @property
    def changed_from(self) -> int | None:
        """Where its prompt-changed loss starts, as lists say it: `diverged_at` (token-exact, against
        its template's earlier prompts under its salt), unless that lies in a block lost to another
        cause (a salted request's first block, whose tokens another salt had): then the first token of
        its prompt-changed loss, so that the tokens said changed are never those said lost to the salt."""
        if self.diverged_at is None:
            return None
        starts = [loss.first_token for loss in self.loss_runs if loss.cause == _Cause.PROMPT_CHANGED]
        return max(self.diverged_at, starts[0]) if starts else self.diverged_at

    @property
    def loss_runs(self) -> tuple[Loss, ...]:
        """Its losses (stored as JSON, `Loss.to_json`), in prompt order. Read anew on each call: bind
        it once where it is read in a loop."""
        return tuple(Loss.from_json(stored) for stored in self.losses)


LOST_COLUMNS = {cause.value: f"{cause.value}_tokens" for cause in RequestDiagnosis.Cause}
FUNNEL_COLUMNS = (  # a diagnosis's funnel, each step a subset of the one before
    "prompt_tokens",
    "seen_before_tokens",
    "resident_anywhere_tokens",
    "resident_here_tokens",
    "reused_tokens",
)
