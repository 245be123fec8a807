"""Rejected input is tallied under a fixed reason code (collectors/errors.py RejectReason), the
message kept apart in `detail`; the free-text reasons of the tally so far are mapped to a code (or
`other`), their text kept as the detail, and tallies falling under one code merged. Samples of
undecodable KV events get a table.

The mapping is frozen here (the messages of the releases before the codes), not imported."""

import re

import django.db.models.deletion
from django.db import migrations, models

# (pattern at the start of the old reason, code), first match wins.
_CODES = [
    (r"refused \(429\): the process", "busy"),
    (r"refused \(429\): the database", "database_busy"),
    (r"refused by the database|not storable", "not_storable"),
    (r"queue full", "queue_full"),
    (r"spill file", "spill_unreadable"),
    (r"SUB message:|replay reply:|topic:|seq:", "kv_frames"),
    (r"batch: not a msgpack value|event: not decodable", "kv_not_msgpack"),
    (r"batch: expected", "kv_batch_shape"),
    (r"event: unknown type", "kv_unknown_type"),
    (r"event:|(BlockStored|BlockRemoved|AllBlocksCleared): does not match", "kv_event_shape"),
    (r"(BlockStored|BlockRemoved|AllBlocksCleared)\.\w+: missing", "kv_field_missing"),
    (r"(BlockStored|BlockRemoved|AllBlocksCleared)\.\w+: expected", "kv_field_invalid"),
    (r"arrived_at: no time zone", "no_time_zone"),
    (r"arrived_at: older than", "too_old"),
    (r"arrived_at: further ahead", "too_far_ahead"),
    (r"cached_tokens: more than prompt_tokens", "cached_over_prompt"),
    (r"model: the server serves no", "unknown_model"),
    (r"\w+: longer than", "text_too_long"),
    (r"\w+: (contains a NUL|not valid Unicode)", "text_invalid"),
    (r"record: not|body:|answer: not", "body_invalid"),
    (r".*(expected a token count|expected a duration|prompt_tokens_details)", "usage_invalid"),
    (r"request_id: empty|.*(Expected `|missing required field|Invalid )", "field_invalid"),
]


def code_of(reason: str) -> str:
    return next((code for pattern, code in _CODES if re.match(pattern, reason)), "other")


def to_codes(apps, schema_editor):
    RejectedInput = apps.get_model("traffic", "RejectedInput")
    merged = {}
    for row in RejectedInput.objects.order_by("last_seen_at"):
        key = (row.server_id, row.source, code_of(row.reason))
        into = merged.get(key)
        if into is None:
            merged[key] = row
            row.detail = row.reason[:300]
            continue
        into.count += row.count
        into.first_seen_at = min(into.first_seen_at, row.first_seen_at)
        into.last_seen_at, into.detail = row.last_seen_at, row.reason[:300]  # ordered: the latest
    RejectedInput.objects.exclude(pk__in=[row.pk for row in merged.values()]).delete()
    for (_, _, code), row in merged.items():
        row.reason = code
        row.save(update_fields=["reason", "detail", "count", "first_seen_at", "last_seen_at"])


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0001_initial'),
        ('traffic', '0002_causes_new_content_tiers_hosted_parts'),
    ]

    operations = [
        migrations.AddField(
            model_name='rejectedinput',
            name='detail',
            field=models.CharField(blank=True, default='', help_text="The latest rejection's message", max_length=300),
        ),
        migrations.RunPython(to_codes, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='rejectedinput',
            name='reason',
            field=models.CharField(help_text='A RejectReason code (collectors/errors.py)', max_length=40),
        ),
        migrations.CreateModel(
            name='UndecodableSample',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('reason', models.CharField(help_text='A RejectReason code (collectors/errors.py)', max_length=40)),
                ('seen_at', models.DateTimeField()),
                ('head', models.BinaryField(help_text='Up to the first 64 bytes of what was refused')),
                ('server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.server')),
            ],
            options={
                'indexes': [models.Index(fields=['server', 'reason', '-seen_at'], name='undecodable_sample_newest')],
            },
        ),
    ]
