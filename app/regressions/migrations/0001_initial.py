"""The regressions app's schema, in one migration: what its migrations of 0.1.0 development built."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    # The migrations squashed into this one: a database they made (all of them) is taken as migrated.
    # Their 0001_initial is not listed: this one took its name, and none can replace itself.
    # Delete once no such database is left (see docs/data.md).
    replaces = [
        ('regressions', '0002_remove_stub'),
        ('regressions', '0003_regressions'),
        ('regressions', '0004_regression_evidence'),
        ('regressions', '0005_scopes_ttft_resolution'),
        ('regressions', '0006_scope_lost_tokens'),
    ]

    initial = True

    dependencies = [
        ('auth', '__first__'),
        ('fleet', '0001_initial'),
        ('prompts', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='Regression',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scope', models.CharField(choices=[('template', 'Template'), ('template_server', 'Template on a server'), ('template_tenant', 'Template for a tenant'), ('server', 'Server'), ('tenant', 'Tenant'), ('fleet', 'Fleet')], max_length=20)),
                ('tenant', models.CharField(blank=True, max_length=100)),
                ('metric', models.CharField(choices=[('hit_rate', 'Hit rate'), ('ttft', 'TTFT p90')], default='hit_rate', max_length=10)),
                ('changed_at', models.DateTimeField(help_text='The first minute after the change point')),
                ('detected_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('resolved_at', models.DateTimeField(blank=True, null=True)),
                ('rate_before', models.FloatField()),
                ('rate_after', models.FloatField()),
                ('rate_now', models.FloatField(help_text='Over the last minutes, as of updated_at')),
                ('requests_before', models.PositiveIntegerField()),
                ('requests_after', models.PositiveIntegerField(help_text='Since the change, as of updated_at')),
                ('confidence', models.FloatField()),
                ('method', models.JSONField(default=dict, help_text='The detection method, its parameters and figures')),
                ('kind', models.CharField(choices=[('template_commit', 'Template commit'), ('capacity', 'Capacity drop'), ('routing', 'Routing change'), ('salt_rotation', 'Salt rotation'), ('restart', 'Restart'), ('unknown', 'Unknown')], default='unknown', max_length=20)),
                ('expected', models.BooleanField(default=False, help_text='Transient by nature: closes once warm again')),
                ('candidates', models.JSONField(blank=True, default=list, help_text='Suspects, best first, with scores')),
                ('cause_shift', models.JSONField(blank=True, default=dict, help_text="Lost tokens' causes, before and after")),
                ('lost_tokens_per_hour', models.FloatField(default=0, help_text='Prefill tokens an hour lost over what its scope lost at its rate before')),
                ('prefill_tokens_per_second', models.FloatField(default=0)),
                ('prefill_rate_source', models.CharField(blank=True, help_text='measured or configured', max_length=20)),
                ('gpu_seconds_per_hour', models.FloatField(default=0)),
                ('cost_per_hour', models.FloatField(default=0, help_text='At PREFIXSCOPE_GPU_HOUR_PRICE')),
                ('state', models.CharField(choices=[('open', 'Open'), ('acknowledged', 'Acknowledged'), ('muted', 'Muted'), ('resolved', 'Resolved')], default='open', max_length=15)),
                ('note', models.TextField(blank=True)),
                ('noted_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('server', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, to='fleet.server')),
                ('suspect_version', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='prompts.templateversion')),
                ('template', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, to='prompts.template')),
                ('evidence', models.JSONField(blank=True, default=dict, help_text='A before/after pair of requests, its divergence and Compare permalink')),
                ('resolution', models.CharField(blank=True, choices=[('recovered', 'Recovered'), ('reverted', 'Version reverted'), ('idle', 'Scope idle')], max_length=10)),
                ('ttft_after_seconds', models.FloatField(blank=True, null=True)),
                ('ttft_before_seconds', models.FloatField(blank=True, help_text='p90, geometric mean per minute', null=True)),
                ('ttft_now_seconds', models.FloatField(blank=True, help_text='p90 of the last minutes', null=True)),
                ('scope_lost_tokens_per_hour', models.FloatField(default=0, help_text="All its scope's lost tokens an hour over the same window: its pages' figure")),
            ],
            options={
                'ordering': ['-changed_at', 'id'],
                'indexes': [models.Index(fields=['state', 'scope'], name='regression_state')],
                'constraints': [models.UniqueConstraint(fields=('scope', 'template', 'server', 'tenant', 'metric', 'changed_at'), name='regression_identity', nulls_distinct=False)],
            },
        ),
    ]
