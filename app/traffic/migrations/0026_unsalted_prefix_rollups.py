"""The salt audit's rollups of unsalted first blocks per minute and hour (UnsaltedPrefixMinute,
UnsaltedPrefixHour), filled from every record kept, as app/rollups/refresh.py
refresh_unsalted_prefixes fills them: set-based, one pass over the records (their first block is read
from each row's TOASTed block hashes: on the 10M-record bench fleet this pass is most of the time)."""

import django.db.models.deletion
from django.db import migrations, models

LATEST_RECORD = "ORDER BY arrived_at DESC, server_id DESC, request_id DESC"
LATEST_ROW = "ORDER BY last_seen_at DESC, last_server_id DESC, last_request_id DESC"
COLUMNS = "model, first_block, tenant, template_id, requests, last_seen_at, last_server_id, last_request_id"
FILL_MINUTES_SQL = f"""
INSERT INTO traffic_unsaltedprefixminute (minute, {COLUMNS})
SELECT minute, {COLUMNS} FROM (
    SELECT date_trunc('minute', arrived_at) AS minute, model, block_hashes[1] AS first_block, tenant,
           template_id, count(*) AS requests, max(arrived_at) AS last_seen_at,
           (array_agg(server_id {LATEST_RECORD}))[1] AS last_server_id,
           (array_agg(request_id {LATEST_RECORD}))[1] AS last_request_id,
           sum(count(*)) OVER (PARTITION BY date_trunc('hour', date_trunc('minute', arrived_at)), model,
                                     block_hashes[1]) AS in_hour
    FROM traffic_requestrecord
    WHERE salt_hash = '' AND tenant <> '' AND block_hashes[1] IS NOT NULL
    GROUP BY 1, 2, 3, 4, 5
) grouped
WHERE in_hour >= 2
"""
FILL_HOURS_SQL = f"""
INSERT INTO traffic_unsaltedprefixhour (hour, {COLUMNS})
SELECT date_trunc('hour', minute), model, first_block, tenant, template_id, sum(requests),
       max(last_seen_at), (array_agg(last_server_id {LATEST_ROW}))[1], (array_agg(last_request_id {LATEST_ROW}))[1]
FROM traffic_unsaltedprefixminute GROUP BY 1, 2, 3, 4, 5
"""


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0004_server_num_gpu_blocks'),
        ('prompts', '0006_template_regression_min_drop'),
        ('traffic', '0025_template_hour_sums'),
    ]

    operations = [
        migrations.CreateModel(
            name='UnsaltedPrefixHour',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('model', models.CharField(blank=True, max_length=255)),
                ('first_block', models.BigIntegerField(help_text="The first block hash, a uint64 as a two's-complement bigint")),
                ('tenant', models.CharField(max_length=100)),
                ('requests', models.PositiveIntegerField()),
                ('last_seen_at', models.DateTimeField()),
                ('last_request_id', models.CharField(max_length=255)),
                ('hour', models.DateTimeField()),
                ('last_server', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.server')),
                ('template', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='prompts.template')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('hour', 'model', 'first_block', 'tenant', 'template'), name='unsalted_prefix_hour_identity', nulls_distinct=False)],
            },
        ),
        migrations.CreateModel(
            name='UnsaltedPrefixMinute',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('model', models.CharField(blank=True, max_length=255)),
                ('first_block', models.BigIntegerField(help_text="The first block hash, a uint64 as a two's-complement bigint")),
                ('tenant', models.CharField(max_length=100)),
                ('requests', models.PositiveIntegerField()),
                ('last_seen_at', models.DateTimeField()),
                ('last_request_id', models.CharField(max_length=255)),
                ('minute', models.DateTimeField()),
                ('last_server', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.server')),
                ('template', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='prompts.template')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('minute', 'model', 'first_block', 'tenant', 'template'), name='unsalted_prefix_minute_identity', nulls_distinct=False)],
            },
        ),
        # The grouping sorts a row per record: in memory, not in files (this transaction alone).
        migrations.RunSQL("SET LOCAL work_mem = '256MB'", migrations.RunSQL.noop),
        migrations.RunSQL(FILL_MINUTES_SQL, migrations.RunSQL.noop),
        migrations.RunSQL(FILL_HOURS_SQL, migrations.RunSQL.noop),
    ]
