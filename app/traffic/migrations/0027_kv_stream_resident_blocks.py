"""Each KV stream's count of resident blocks (KVStream.resident_blocks), filled from the block index
as it stands; the KV-event service keeps it after (app/traffic/services/kv_events.py)."""

from django.db import migrations, models

FILL_SQL = """
UPDATE traffic_kvstream AS s SET resident_blocks = counted.blocks
FROM (SELECT server_id, dp_rank, count(*) AS blocks FROM traffic_residentblock GROUP BY 1, 2) AS counted
WHERE s.server_id = counted.server_id AND s.dp_rank = counted.dp_rank
"""


class Migration(migrations.Migration):

    dependencies = [
        ("traffic", "0026_unsalted_prefix_rollups"),
    ]

    operations = [
        migrations.AddField(
            model_name="kvstream",
            name="resident_blocks",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.RunSQL(FILL_SQL, migrations.RunSQL.noop),
    ]
