"""The sums of the diagnoses' losses per period: per server, template, version and tenant by the
minute and the hour, and those summed per server or per template (app/rollups/ keeps them)."""

from django.db import models

from app.traffic.models.ids import next_id
from collectors import records


class LossTotals(models.Model):
    """Sums of the diagnoses (app/diagnosis/run.py) over one period per server,
    template, template version and tenant: the funnel's steps and the tokens lost per cause."""

    tenant = models.CharField(max_length=records.TENANT_MAX, blank=True)
    requests = models.PositiveIntegerField()
    diagnosed = models.PositiveIntegerField(help_text="Requests with a diagnosis (the rest: unknown)")
    unexpected_hits = models.PositiveIntegerField(default=0)
    # Answered by a gateway's response (semantic) cache: the model never saw them. Counted apart,
    # never as reuse, and in neither `diagnosed` nor the hit rates.
    gateway_cache_hits = models.PositiveIntegerField(default=0, db_default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    # Of the diagnosed requests alone: their hit rate is reused_tokens / diagnosed_prompt_tokens (a
    # request without a diagnosis, its cached tokens unknown, reused nothing that is known).
    diagnosed_prompt_tokens = models.BigIntegerField(default=0)
    seen_before_tokens = models.BigIntegerField(default=0)
    resident_anywhere_tokens = models.BigIntegerField(default=0)
    resident_here_tokens = models.BigIntegerField(default=0)
    reused_tokens = models.BigIntegerField(default=0)
    prompt_changed_tokens = models.BigIntegerField(default=0)
    evicted_tokens = models.BigIntegerField(default=0)
    routed_elsewhere_tokens = models.BigIntegerField(default=0)
    salt_tokens = models.BigIntegerField(default=0)
    restarted_tokens = models.BigIntegerField(default=0)
    below_block_tokens = models.BigIntegerField(default=0)
    cold_tokens = models.BigIntegerField(default=0)
    unexplained_tokens = models.BigIntegerField(default=0)
    no_kv_events_tokens = models.BigIntegerField(default=0)
    new_content_tokens = models.BigIntegerField(default=0)
    demoted_tokens = models.BigIntegerField(default=0)
    below_minimum_tokens = models.BigIntegerField(default=0)
    ttl_lapsed_tokens = models.BigIntegerField(default=0)
    beyond_lookback_tokens = models.BigIntegerField(default=0)
    marker_absent_tokens = models.BigIntegerField(default=0)
    cache_key_changed_tokens = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class LossMinute(LossTotals):
    """Per-minute sums of the diagnoses.

    Dashboards, the REST API and the tenant audit read these, never raw diagnoses. Routing
    effectiveness of a group of compatible servers is its reused / resident-anywhere tokens.
    """

    pk = models.CompositePrimaryKey("server", "id")
    id = models.BigIntegerField(db_default=next_id("traffic_lossminute"), editable=False)
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    template = models.ForeignKey("prompts.Template", null=True, blank=True, on_delete=models.CASCADE)
    template_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    minute = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["server", "template", "template_version", "tenant", "minute"],
                name="loss_minute_identity",
                nulls_distinct=False,
            ),
        ]
        indexes = [
            models.Index(fields=["minute"], name="loss_minute_time"),
            # A tenant's view of the fleet's quarter hours (ServerLossQuarter) reads these few rows
            # from the minutes: tenant-less ones, of its templates on servers it does not own.
            models.Index(
                fields=["template", "minute"], name="loss_minute_untenanted", condition=models.Q(tenant="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.template_id}/{self.tenant} {self.minute:%Y-%m-%d %H:%M}"


class LossHour(LossTotals):
    """The loss minutes summed per hour, for series of a day or longer. Recomputed from the
    minutes whenever they are."""

    pk = models.CompositePrimaryKey("server", "id")
    id = models.BigIntegerField(db_default=next_id("traffic_losshour"), editable=False)
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    template = models.ForeignKey(
        "prompts.Template", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    template_version = models.ForeignKey(
        "prompts.TemplateVersion", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    hour = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["server", "template", "template_version", "tenant", "hour"],
                name="loss_hour_identity",
                nulls_distinct=False,
            ),
        ]
        indexes = [
            models.Index(fields=["hour"], name="loss_hour_time"),
            models.Index(fields=["template", "hour"], name="loss_hour_template_time"),
            # A tenant's Templates list: the tenant-less rows of its servers (TemplateLossHour's
            # app/rollups/visibility.py), a few among the tenants' ones.
            models.Index(
                fields=["server", "hour"], name="loss_hour_untenanted", condition=models.Q(tenant="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.template_id}/{self.tenant} {self.hour:%Y-%m-%d %H}h"


class ServerLossHour(LossTotals):
    """The loss hours of one server and tenant summed over templates and versions: the fleet's lost
    tokens over a day or a week, a server having one tenant or a few, never x templates x versions.

    Tenancy (app/rollups/visibility.py): these sums serve the rows of the viewer's tenants and the tenant-less
    rows of its servers; tenant-less rows of its templates on other servers stay in LossHour.
    Recomputed from the loss hours whenever they are.
    """

    pk = models.CompositePrimaryKey("server", "tenant", "hour")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="server_loss_hour_time")]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.tenant} {self.hour:%Y-%m-%d %H}h"


class ServerLossQuarter(LossTotals):
    """The loss minutes of one server and tenant summed per quarter hour: the fleet's and a tenant's
    lost tokens in buckets of 15 minutes (a day of a fleet is a few rows per server and quarter, not
    one per server, template, version, tenant and minute). `minute` is the quarter's first.

    Tenancy as ServerLossHour's; the tenant-less rows of a viewer's templates on other servers stay
    in LossMinute (its index loss_minute_untenanted). Recomputed from the minutes whenever they are.
    """

    pk = models.CompositePrimaryKey("server", "tenant", "minute")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["minute"], name="server_loss_quarter_time")]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.tenant} {self.minute:%Y-%m-%d %H:%M}+15min"


class TemplateLossHour(LossTotals):
    """The loss hours of one template and tenant summed over servers and versions: a template's lost
    tokens over a day or a week, for the Templates list and the template's page.

    Tenancy (app/rollups/visibility.py): these sums serve the rows of the viewer's tenants and the
    tenant-less rows of its templates; the tenant-less rows of shared templates on its servers are
    read from LossHour. Recomputed from the loss hours whenever they are; a small table, as
    TemplateRequestHour.
    """

    pk = models.CompositePrimaryKey("template", "hour", "tenant")
    template = models.ForeignKey("prompts.Template", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="template_loss_hour_time")]

    def __str__(self) -> str:
        return f"{self.template_id}/{self.tenant} {self.hour:%Y-%m-%d %H}h"


class ServerLossMinute(LossTotals):
    """The loss minutes of one server and tenant summed over templates and versions: the Fleet page's
    lost tokens and routing over the minutes of its window.

    Tenancy as ServerLossHour's (app/rollups/visibility.py): the tenant-less rows of a viewer's templates on
    other servers stay in LossMinute. Recomputed from the minutes in the transaction that writes them.
    """

    pk = models.CompositePrimaryKey("server", "tenant", "minute")
    server = models.ForeignKey("fleet.Server", on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["minute"], name="server_loss_minute_time")]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.tenant} {self.minute:%Y-%m-%d %H:%M}"
