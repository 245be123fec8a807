"""Per-server sums of the hour rollups (ServerRequestHour, ServerLossHour), filled from the hours
already summed; the rollup services keep them after (app/rollups/refresh.py; the SQL of
this day written out here, as 0015 did)."""

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
INSERT INTO traffic_serverrequesthour (server_id, hour, {", ".join(TOTALS)}, client_ttft_buckets,
                                       server_ttft_buckets)
SELECT server_id, hour, {", ".join(f"sum({c})" for c in TOTALS)},
       {_summed("client_ttft_buckets")}, {_summed("server_ttft_buckets")}
FROM traffic_hourrollup GROUP BY 1, 2;
INSERT INTO traffic_serverlosshour (server_id, tenant, hour, {", ".join(LOSS_TOTALS)})
SELECT server_id, tenant, hour, {", ".join(f"sum({c})" for c in LOSS_TOTALS)}
FROM traffic_losshour GROUP BY 1, 2, 3;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0003_served_models'),
        ('traffic', '0020_collector_process_per_process'),
    ]

    operations = [
        migrations.CreateModel(
            name='ServerLossHour',
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
                ('pk', models.CompositePrimaryKey('server', 'tenant', 'hour', blank=True, editable=False, primary_key=True, serialize=False)),
                ('hour', models.DateTimeField()),
                ('server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.server')),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='server_loss_hour_time')],
            },
        ),
        migrations.CreateModel(
            name='ServerRequestHour',
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
                ('pk', models.CompositePrimaryKey('server', 'hour', blank=True, editable=False, primary_key=True, serialize=False)),
                ('hour', models.DateTimeField()),
                ('server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.server')),
            ],
            options={
                'indexes': [models.Index(fields=['hour'], name='server_request_hour_time')],
            },
        ),
        migrations.RunSQL(FILL_SQL, migrations.RunSQL.noop),
    ]
