"""A request record keeps both TTFTs: as the client saw it and as vLLM measured it.

Until now one column took whichever source wrote last, so vLLM's span overwrote the gateway's
measure on every joined record. What is stored stays the client's (the gateway's, or a REST
sender's) under its new name; vLLM's measure gets its own column. The per-minute rollup keeps one
histogram of each. Renames are metadata only in PostgreSQL, on every partition at once. Records
first stored from a span held vLLM's measure: it moves to its column.
"""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("traffic", "0006_kv_event_block_index_int4")]

    operations = [
        migrations.RenameField("requestrecord", "ttft_seconds", "client_ttft_seconds"),
        migrations.AlterField(
            model_name="requestrecord",
            name="client_ttft_seconds",
            field=models.FloatField(
                blank=True,
                help_text="Time to first token as the client saw it (gateway, application)",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="requestrecord",
            name="server_ttft_seconds",
            field=models.FloatField(
                blank=True,
                help_text="Time to first token as vLLM measured it (its llm_request span)",
                null=True,
            ),
        ),
        migrations.RunSQL(
            "UPDATE traffic_requestrecord SET server_ttft_seconds = client_ttft_seconds, "
            "client_ttft_seconds = NULL WHERE source = 'otlp' AND client_ttft_seconds IS NOT NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="requestrecord",
            name="request_id",
            field=models.CharField(
                help_text="Canonical: the client's X-Request-Id, else vLLM's own (collectors/records.py)",
                max_length=255,
            ),
        ),
        migrations.RenameField("minuterollup", "ttft_count", "client_ttft_count"),
        migrations.RenameField("minuterollup", "ttft_sum_seconds", "client_ttft_sum_seconds"),
        migrations.RenameField("minuterollup", "ttft_buckets", "client_ttft_buckets"),
        migrations.AlterField(
            model_name="minuterollup", name="client_ttft_count", field=models.PositiveIntegerField(default=0)
        ),
        migrations.AlterField(
            model_name="minuterollup", name="client_ttft_sum_seconds", field=models.FloatField(default=0)
        ),
        migrations.AlterField(
            model_name="minuterollup",
            name="client_ttft_buckets",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.IntegerField(), default=list, size=None
            ),
        ),
        migrations.AddField(
            model_name="minuterollup", name="server_ttft_count", field=models.PositiveIntegerField(default=0)
        ),
        migrations.AddField(
            model_name="minuterollup", name="server_ttft_sum_seconds", field=models.FloatField(default=0)
        ),
        migrations.AddField(
            model_name="minuterollup",
            name="server_ttft_buckets",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.IntegerField(), default=list, size=None
            ),
        ),
    ]
