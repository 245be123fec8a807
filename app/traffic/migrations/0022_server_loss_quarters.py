"""The loss minutes summed per server, tenant and quarter hour (ServerLossQuarter), filled from the
minutes already summed; and the index a tenant's view of them reads the rest from."""

import django.db.models.deletion
from django.db import migrations, models


LOSS_TOTALS = ["requests", "diagnosed", "unexpected_hits", "diagnosed_prompt_tokens", "prompt_tokens",
               "seen_before_tokens", "resident_anywhere_tokens", "resident_here_tokens", "reused_tokens",
               "prompt_changed_tokens", "evicted_tokens", "routed_elsewhere_tokens", "salt_tokens",
               "restarted_tokens", "below_block_tokens", "cold_tokens", "unexplained_tokens",
               "no_kv_events_tokens"]  # fmt: skip
FILL_SQL = f"""
INSERT INTO traffic_serverlossquarter (server_id, tenant, minute, {", ".join(LOSS_TOTALS)})
SELECT server_id, tenant, date_bin('15 minutes', minute, TIMESTAMPTZ '2000-01-01'),
       {", ".join(f"sum({c})" for c in LOSS_TOTALS)}
FROM traffic_lossminute GROUP BY 1, 2, 3
"""


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0003_served_models'),
        ('prompts', '0006_template_regression_min_drop'),
        ('traffic', '0021_server_hour_sums'),
    ]

    operations = [
        migrations.CreateModel(
            name='ServerLossQuarter',
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
        migrations.AddIndex(
            model_name='lossminute',
            index=models.Index(condition=models.Q(('tenant', '')), fields=['template', 'minute'], name='loss_minute_untenanted'),
        ),
        migrations.AddIndex(
            model_name='serverlossquarter',
            index=models.Index(fields=['minute'], name='server_loss_quarter_time'),
        ),
        migrations.RunSQL(FILL_SQL, migrations.RunSQL.noop),
    ]
