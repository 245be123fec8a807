# Drops the lone server and template indexes of request records (see RequestRecord). Only the
# indexes: AlterField would also drop and re-add the foreign keys, re-checking every stored row
# while inserts wait.

import django.db.models.deletion
from django.db import migrations, models

INDEXES = {
    "traffic_requestrecord_server_id_8afae8e5": "server_id",
    "traffic_requestrecord_template_id_9e1e77a2": "template_id",
}


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0002_scrape_schedule"),
        ("prompts", "0001_initial"),
        ("traffic", "0003_rollup_cache_known_prompt_tokens"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="requestrecord",
                    name="server",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="fleet.server",
                    ),
                ),
                migrations.AlterField(
                    model_name="requestrecord",
                    name="template",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to="prompts.template",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=f"DROP INDEX IF EXISTS {name}",
                    reverse_sql=f"CREATE INDEX IF NOT EXISTS {name} ON traffic_requestrecord ({column})",
                )
                for name, column in INDEXES.items()
            ],
        ),
    ]
