"""KVEvent.block_index becomes an integer: one BlockStored event of a long prompt can carry more than
32,767 blocks (a 1M-token context in blocks of 16 is 65,536), which a smallint cannot number.

Plain SQL: PostgreSQL changes the column on every partition and keeps the primary key it is part of.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("traffic", "0005_kv_event_no_server_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE traffic_kvevent ALTER COLUMN block_index TYPE integer",
                    reverse_sql="ALTER TABLE traffic_kvevent ALTER COLUMN block_index TYPE smallint",
                )
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="kvevent",
                    name="block_index",
                    field=models.IntegerField(default=0, help_text="Position of the hash in the event"),
                ),
            ],
        ),
    ]
