"""KVEvent.server loses its own index: the primary key and kv_event_server_hash both start with server_id.

Only the index is dropped: Django's AlterField would also drop and re-add (re-validate) the foreign key.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEX = "traffic_kvevent_server_id_9c595903"  # Django's name for it, the same on every install


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0002_scrape_schedule"),
        ("traffic", "0004_request_record_no_redundant_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "traffic_kvevent" ("server_id")',
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="kvevent",
                    name="server",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="fleet.server",
                    ),
                ),
            ],
        ),
    ]
