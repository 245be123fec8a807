"""Per-template sums of the hour rollups (TemplateRequestHour, TemplateLossHour), filled from the
hours already summed, one INSERT ... SELECT ... GROUP BY each; the rollup services keep them after
(app/rollups/refresh.py; the SQL of this day written out here, as 0021 did). And the indexes
a tenant's view of them reads the rest from: its servers' hour rollups, their totals included, and
the tenant-less loss hours of its servers."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


TOTALS = ["requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens", "client_ttft_count",
          "client_ttft_sum_seconds", "server_ttft_count", "server_ttft_sum_seconds", "prefill_count",
          "prefill_uncached_sum", "prefill_ttft_sum", "prefill_uncached_squares", "prefill_cross_sum"]  # fmt: skip
LOSS_TOTALS = ["requests", "diagnosed", "unexpected_hits", "diagnosed_prompt_tokens", "prompt_tokens",
               "seen_before_tokens", "resident_anywhere_tokens", "resident_here_tokens", "reused_tokens",
               "prompt_changed_tokens", "evicted_tokens", "routed_elsewhere_tokens", "salt_tokens",
               "restarted_tokens", "below_block_tokens", "cold_tokens", "unexplained_tokens",
               "no_kv_events_tokens"]  # fmt: skip
BUCKET_POSITIONS = 23  # TTFT_BUCKETS_SECONDS and +Inf


def _summed(column: str) -> str:
    return "ARRAY[" + ", ".join(f"coalesce(sum({column}[{i}]), 0)" for i in range(1, BUCKET_POSITIONS + 1)) + "]"


FILL_SQL = f"""
INSERT INTO traffic_templaterequesthour (template_id, hour, {", ".join(TOTALS)}, client_ttft_buckets,
                                         server_ttft_buckets)
SELECT template_id, hour, {", ".join(f"sum({c})" for c in TOTALS)},
       {_summed("client_ttft_buckets")}, {_summed("server_ttft_buckets")}
FROM traffic_hourrollup WHERE template_id IS NOT NULL GROUP BY 1, 2;
INSERT INTO traffic_templatelosshour (template_id, hour, tenant, {", ".join(LOSS_TOTALS)})
SELECT template_id, hour, tenant, {", ".join(f"sum({c})" for c in LOSS_TOTALS)}
FROM traffic_losshour WHERE template_id IS NOT NULL GROUP BY 1, 2, 3;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('prompts', '0006_template_regression_min_drop'),
        ('traffic', '0024_server_minute_sums'),
    ]

    operations = [
        migrations.CreateModel(
            name='TemplateLossHour',
            fields=[
                ('tenant', models.CharField(blank=True, max_length=100)),
                ('requests', models.PositiveIntegerField()),
                ('diagnosed', models.PositiveIntegerField(help_text='Requests with a diagnosis (the rest: unknown)')),
                ('unexpected_hits', models.PositiveIntegerField(default=0)),
                ('prompt_tokens', models.BigIntegerField(default=0)),
                ('diagnosed_prompt_tokens', models.BigIntegerField(default=0)),
                ('seen_before_tokens', models.BigIntegerField(default=0)),
                ('resident_anywhere_tokens', models.BigIntegerField(default=0)),
                ('resident_here_tokens', models.BigIntegerField(default=0)),
                ('reused_tokens', models.BigIntegerField(default=0)),
                ('prompt_changed_tokens', models.BigIntegerField(default=0)),
                ('evicted_tokens', models.BigIntegerField(default=0)),
                ('routed_elsewhere_tokens', models.BigIntegerField(default=0)),
                ('salt_tokens', models.BigIntegerField(default=0)),
                ('restarted_tokens', models.BigIntegerField(default=0)),
                ('below_block_tokens', models.BigIntegerField(default=0)),
                ('cold_tokens', models.BigIntegerField(default=0)),
                ('unexplained_tokens', models.BigIntegerField(default=0)),
                ('no_kv_events_tokens', models.BigIntegerField(default=0)),
                ('pk', models.CompositePrimaryKey('template', 'hour', 'tenant', blank=True, editable=False, primary_key=True, serialize=False)),
                ('hour', models.DateTimeField()),
                ('template', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='prompts.template')),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='template_loss_hour_time')],
            },
        ),
        migrations.CreateModel(
            name='TemplateRequestHour',
            fields=[
                ('requests', models.PositiveIntegerField()),
                ('prompt_tokens', models.BigIntegerField()),
                ('cached_tokens', models.BigIntegerField()),
                ('cache_known_prompt_tokens', models.BigIntegerField(default=0)),
                ('client_ttft_count', models.PositiveIntegerField(default=0)),
                ('client_ttft_sum_seconds', models.FloatField(default=0)),
                ('client_ttft_buckets', django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), default=list, size=None)),
                ('server_ttft_count', models.PositiveIntegerField(default=0)),
                ('server_ttft_sum_seconds', models.FloatField(default=0)),
                ('server_ttft_buckets', django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), default=list, size=None)),
                ('prefill_count', models.PositiveIntegerField(default=0)),
                ('prefill_uncached_sum', models.FloatField(default=0)),
                ('prefill_ttft_sum', models.FloatField(default=0)),
                ('prefill_uncached_squares', models.FloatField(default=0)),
                ('prefill_cross_sum', models.FloatField(default=0, help_text='Sum of uncached tokens times TTFT seconds')),
                ('pk', models.CompositePrimaryKey('template', 'hour', blank=True, editable=False, primary_key=True, serialize=False)),
                ('hour', models.DateTimeField()),
                ('template', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='prompts.template')),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='template_request_hour_time')],
            },
        ),
        migrations.AddIndex(
            model_name='hourrollup',
            index=models.Index(fields=['server', 'hour'], include=('template', 'requests', 'prompt_tokens', 'cached_tokens', 'cache_known_prompt_tokens'), name='hour_rollup_server_sums'),
        ),
        migrations.AddIndex(
            model_name='losshour',
            index=models.Index(condition=models.Q(('tenant', '')), fields=['server', 'hour'], name='loss_hour_untenanted'),
        ),
        migrations.RunSQL(FILL_SQL, migrations.RunSQL.noop),
    ]
