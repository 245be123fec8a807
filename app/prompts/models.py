from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from app.domain.killers import SUGGESTIONS, KillerClass
from collectors import records


class TemplateRepository(models.Model):
    """A git repository of prompt templates: a local path read in place, or a URL fetched into a cache.

    Its import state says what the last import did (app/prompts/history.py writes it while it runs).
    """

    class State(models.TextChoices):
        IDLE = "idle", "Idle"
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Importing"
        FAILED = "failed", "Failed"

    name = models.CharField(max_length=200, unique=True)
    location = models.CharField(
        max_length=1000, unique=True, help_text="An absolute local path, or an http(s):// or file:// URL"
    )
    globs = ArrayField(
        models.CharField(max_length=300), help_text="Template files, git wildmatch patterns: templates/*.j2"
    )
    branch = models.CharField(max_length=200, blank=True, help_text="The branch or ref followed; blank: HEAD")
    # The HMAC key of GitHub's signatures must be kept as it is to check them (a hash would not do):
    # never shown by the API, the admin or a log line.
    webhook_secret = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.IDLE)
    commits_imported = models.PositiveIntegerField(
        default=0, help_text="Commits read so far by the last import"
    )
    commits_total = models.PositiveIntegerField(default=0, help_text="Commits the last import had to read")
    last_error = models.TextField(blank=True)
    last_imported_sha = models.CharField(max_length=40, blank=True)
    last_imported_at = models.DateTimeField(null=True, blank=True)
    import_started_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "template repositories"

    def __str__(self) -> str:
        return self.name


class Template(models.Model):
    """A prompt template: one file of a template repository (or, until one is imported, a name that
    traffic used)."""

    name = models.CharField(max_length=200, unique=True)
    repository = models.ForeignKey(
        TemplateRepository, null=True, blank=True, on_delete=models.SET_NULL, related_name="templates"
    )
    path = models.CharField(max_length=500, blank=True, help_text="File of the template in the repository")
    removed_at = models.DateTimeField(
        null=True, blank=True, help_text="When a commit deleted its file (or moved it out of the globs)"
    )
    tenant = models.CharField(max_length=100, blank=True)
    regression_min_drop = models.FloatField(
        null=True, blank=True, help_text="Hit-rate drop that opens a regression; blank: the setting's"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["repository", "path"],
                condition=Q(repository__isnull=False),
                name="template_file_identity",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class TemplateVersion(models.Model):
    """A commit that changed a template (or a version named in traffic before its commit was imported:
    ``imported_at`` is null until the import finds it)."""

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="versions")
    commit_sha = models.CharField(max_length=40)
    committed_at = models.DateTimeField()
    author = models.CharField(max_length=200, blank=True)
    author_email = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    path = models.CharField(max_length=500, blank=True, help_text="The template's file at this commit")
    content = models.TextField(blank=True, help_text="The template's text at this commit")
    diff = models.TextField(
        blank=True, help_text="Unified diff against the file in the commit's first parent"
    )
    tags = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    imported_at = models.DateTimeField(null=True, blank=True)
    first_seen_at = models.DateTimeField(null=True, blank=True, help_text="The first request that named it")

    class Meta:
        ordering = ["template", "-committed_at"]
        constraints = [
            models.UniqueConstraint(fields=["template", "commit_sha"], name="template_version_identity"),
        ]

    def __str__(self) -> str:
        return f"{self.template.name}@{self.commit_sha[:10]}"


class DeployMarker(models.Model):
    """When a template version went live (optionally on one server only)."""

    class Source(models.TextChoices):
        API = "api", "Deploy API"
        TRAFFIC = "traffic", "First request naming it"

    template_version = models.ForeignKey(TemplateVersion, on_delete=models.CASCADE, related_name="deploys")
    server = models.ForeignKey("fleet.Server", null=True, blank=True, on_delete=models.CASCADE)
    deployed_at = models.DateTimeField()
    note = models.CharField(max_length=500, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.API)

    class Meta:
        ordering = ["-deployed_at"]
        indexes = [models.Index(fields=["deployed_at"], name="deploy_marker_time")]
        constraints = [
            models.UniqueConstraint(
                fields=["template_version"], condition=Q(source="traffic"), name="deploy_marker_first_seen"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.template_version} live at {self.deployed_at:%Y-%m-%d %H:%M}"


class CacheKiller(models.Model):
    """A token position (a block in hash-only mode) where a template's recent traffic fans out, and its
    cost, found in the requests of one compatibility record (salt, model, block size) in a window.

    ``samples`` holds the keys of a few requests that vary there (``server_id``, ``request_id``,
    ``arrived_at`` in ISO 8601), never their text: that is prompt text, decoded when shown, for viewers
    who may read prompts (the ``read_prompt_text`` permission) and while the token ids are kept.
    The killers of a template are replaced whole at each run (app/prompts/killers.py).
    """

    class Mode(models.TextChoices):
        TOKENS = "tokens", "Token ids"
        HASHES = "hashes", "Block hashes only"

    class Kind(models.TextChoices):
        TIMESTAMP = KillerClass.TIMESTAMP, "Timestamp or date"
        ID = KillerClass.ID, "Id (uuid, hex, request or trace id)"
        NUMBER = KillerClass.NUMBER, "Counter or number"
        REORDERED_ITEMS = KillerClass.REORDERED_ITEMS, "Reordered items"
        JSON_KEY_ORDER = KillerClass.JSON_KEY_ORDER, "JSON key order"
        WHITESPACE_DRIFT = KillerClass.WHITESPACE_DRIFT, "Whitespace drift"
        PER_USER = KillerClass.PER_USER, "Per-user data in a shared part"
        ROTATING_EXAMPLES = KillerClass.ROTATING_EXAMPLES, "Rotating few-shot examples"
        VARYING_TEXT = KillerClass.VARYING_TEXT, "Varying text"
        UNCLASSIFIED = KillerClass.UNCLASSIFIED, "Unclassified (no text)"

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="killers")
    salt_hash = models.CharField(max_length=64, blank=True, help_text="sha256 of the cache salt; blank: none")
    model = models.CharField(max_length=255, blank=True)
    block_size = models.PositiveIntegerField()
    computed_at = models.DateTimeField()
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    mode = models.CharField(max_length=10, choices=Mode.choices)
    position_token = models.PositiveIntegerField(null=True, blank=True, help_text="Null in hash-only mode")
    block_index = models.PositiveIntegerField(help_text="The block the position is in")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    requests = models.PositiveIntegerField(help_text="Requests sharing the prefix up to the position")
    requests_affected = models.PositiveIntegerField(help_text="Of them, those losing a block or more")
    continuations = models.PositiveIntegerField(help_text="Distinct continuations after the position")
    tokens_lost = models.BigIntegerField(help_text="Prompt tokens a stable text there would have reused")
    straddle_tokens = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Tokens of the position's block before it, recomputed anyway"
    )
    samples = models.JSONField(default=list, blank=True, help_text="Keys of requests that vary there")

    class Meta:
        ordering = ["template", "-tokens_lost", "block_index"]
        indexes = [models.Index(fields=["template", "-tokens_lost"], name="cache_killer_template_cost")]
        permissions = [("read_prompt_text", "Can read prompt text (the samples of cache killers)")]

    def __str__(self) -> str:
        where = (
            f"token {self.position_token}" if self.position_token is not None else f"block {self.block_index}"
        )
        return f"{self.template.name} at {where}: {self.kind}"

    @property
    def suggestion(self) -> str:
        return SUGGESTIONS[KillerClass(self.kind)]


class PrefixFamily(models.Model):
    """Requests without template metadata that share their leading blocks: within one compatibility
    group (model name, block size), the salt-neutral hash of their first ``blocks`` full blocks
    (PREFIXSCOPE_FAMILY_BLOCKS, fewer for a shorter prompt), so tenants' salted copies of one prompt
    are one family. Bound to a template, the requests ingested from then on carry it.

    ``requests`` and ``last_seen_at`` are kept up by the ingest, per batch: approximate (a redelivered
    batch counts again).
    """

    model = models.CharField(max_length=records.MODEL_MAX)
    block_size = models.PositiveIntegerField()
    # The signed (two's-complement) neutral hash of block blocks-1, as request records store hashes.
    key = models.BigIntegerField()
    blocks = models.PositiveSmallIntegerField(help_text="Leading full blocks the key covers")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    requests = models.PositiveIntegerField(default=0, help_text="Approximate: counted per ingested batch")
    # The request that made it, for a link to one of its prompts (records are too many to search).
    sample_server = models.ForeignKey(
        "fleet.Server", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sample_request_id = models.CharField(max_length=records.REQUEST_ID_MAX, blank=True)
    name = models.CharField(max_length=200, blank=True)
    template = models.ForeignKey(
        Template, null=True, blank=True, on_delete=models.SET_NULL, related_name="families"
    )
    bound_at = models.DateTimeField(null=True, blank=True, help_text="Requests after it carry the template")

    class Meta:
        ordering = ["-requests", "-last_seen_at"]
        verbose_name_plural = "prefix families"
        constraints = [
            models.UniqueConstraint(fields=["model", "block_size", "key"], name="prefix_family_identity"),
        ]

    def __str__(self) -> str:
        return self.name or f"{self.model}: first {self.blocks} blocks of {self.block_size} ({self.key:x})"


class VersionCheck(models.Model):
    """The template check of a version, made when it was imported: its template at the version's
    commit against the same file at the commit's first parent (app/prompts/templatecheck), and the
    change priced with the template's traffic of the day before the check.

    ``findings`` holds the report's findings (rule, level, line, token, variable, class, message):
    positions and classes, never prompt text. The price fields are null when the template had no
    traffic then (or for a template's first version: nothing to compare).
    """

    class Verdict(models.TextChoices):
        PASSED = "passed", "Passed"
        FAILED = "failed", "Failed"
        ERROR = "error", "Could not run"

    version = models.OneToOneField(TemplateVersion, on_delete=models.CASCADE, related_name="template_check")
    base_sha = models.CharField(max_length=40, blank=True, help_text="The commit compared with; blank: none")
    checked_at = models.DateTimeField()
    verdict = models.CharField(max_length=10, choices=Verdict.choices)
    error = models.TextField(blank=True, help_text="Why the check could not run")
    block_size = models.PositiveIntegerField(null=True, blank=True)
    base_stable_tokens = models.PositiveIntegerField(null=True, blank=True)
    head_stable_tokens = models.PositiveIntegerField(null=True, blank=True)
    base_blocks = models.PositiveIntegerField(null=True, blank=True, help_text="Reusable blocks before")
    head_blocks = models.PositiveIntegerField(null=True, blank=True, help_text="Reusable blocks after")
    departs_at_token = models.PositiveIntegerField(null=True, blank=True)
    departs_line = models.PositiveIntegerField(null=True, blank=True)
    ends_class = models.CharField(max_length=20, blank=True, help_text="What ends the stable prefix now")
    ends_variable = models.CharField(max_length=100, blank=True)
    findings = models.JSONField(default=list, blank=True)
    priced_at = models.DateTimeField(null=True, blank=True)
    requests_per_hour = models.FloatField(null=True, blank=True)
    reused_tokens_before = models.FloatField(null=True, blank=True, help_text="Per request")
    reused_tokens_after = models.FloatField(null=True, blank=True, help_text="Per request, predicted")
    predicted_tokens_per_hour = models.FloatField(
        null=True, blank=True, help_text="Prompt tokens an hour prefilled again (negative: saved)"
    )
    predicted_gpu_seconds_per_hour = models.FloatField(null=True, blank=True)
    predicted_cost_per_hour = models.FloatField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["verdict", "checked_at"], name="version_check_verdict")]

    def __str__(self) -> str:
        return f"check of {self.version}: {self.verdict}"

    @property
    def breaks_cache(self) -> bool:
        """Whether the check predicts fewer reusable blocks than before."""
        return (
            self.base_blocks is not None
            and self.head_blocks is not None
            and self.head_blocks < self.base_blocks
        )
