"""The minute rollups summed per server (ServerRequestMinute) and per server and tenant
(ServerLossMinute), filled from the minutes already summed (one INSERT ... SELECT each); the rollup
services keep them after (app/rollups/refresh.py; the SQL of this day written out here, as
0021 did). And the index the Fleet page's recent misses walk (RequestDiagnosis.REUSABLE_LOST): built
on every daily partition of the diagnoses."""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.db.models.expressions
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
INSERT INTO traffic_serverrequestminute (server_id, minute, {", ".join(TOTALS)}, client_ttft_buckets,
                                         server_ttft_buckets)
SELECT server_id, minute, {", ".join(f"sum({c})" for c in TOTALS)},
       {_summed("client_ttft_buckets")}, {_summed("server_ttft_buckets")}
FROM traffic_minuterollup GROUP BY 1, 2;
INSERT INTO traffic_serverlossminute (server_id, tenant, minute, {", ".join(LOSS_TOTALS)})
SELECT server_id, tenant, minute, {", ".join(f"sum({c})" for c in LOSS_TOTALS)}
FROM traffic_lossminute GROUP BY 1, 2, 3;
ANALYZE traffic_serverrequestminute;
ANALYZE traffic_serverlossminute;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0004_server_num_gpu_blocks'),
        ('prompts', '0006_template_regression_min_drop'),
        ('traffic', '0023_template_hour_sums_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='ServerLossMinute',
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
                ('pk', models.CompositePrimaryKey('server', 'tenant', 'minute', blank=True, editable=False, primary_key=True, serialize=False)),
                ('minute', models.DateTimeField()),
                ('server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.server')),
            ],
        ),
        migrations.CreateModel(
            name='ServerRequestMinute',
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
                ('pk', models.CompositePrimaryKey('server', 'minute', blank=True, editable=False, primary_key=True, serialize=False)),
                ('minute', models.DateTimeField()),
                ('server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.server')),
            ],
        ),
        migrations.AddIndex(
            model_name='requestdiagnosis',
            index=models.Index(models.OrderBy(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(django.db.models.expressions.CombinedExpression(models.F('prompt_changed_tokens'), '+', models.F('evicted_tokens')), '+', models.F('routed_elsewhere_tokens')), '+', models.F('salt_tokens')), '+', models.F('restarted_tokens')), '+', models.F('cold_tokens')), '+', models.F('unexplained_tokens')), '+', models.F('no_kv_events_tokens')), descending=True), models.OrderBy(models.F('arrived_at'), descending=True), name='diagnosis_reusable_lost'),
        ),
        migrations.AddIndex(
            model_name='serverlossminute',
            index=models.Index(fields=['minute'], name='server_loss_minute_time'),
        ),
        migrations.AddIndex(
            model_name='serverrequestminute',
            index=models.Index(fields=['minute'], name='server_request_minute_time'),
        ),
        migrations.RunSQL(FILL_SQL, migrations.RunSQL.noop),
    ]
