"""The compare app's schema, in one migration: what its migrations of 0.1.0 development built."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('auth', '__first__'),
        ('fleet', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='Comparison',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('slug', models.SlugField(max_length=16, unique=True)),
                ('block_size', models.PositiveIntegerField()),
                ('created_at', models.DateTimeField()),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-created_at'],
                'indexes': [models.Index(fields=['created_at'], name='comparison_created')],
                'constraints': [models.CheckConstraint(condition=models.Q(('block_size__gt', 0)), name='comparison_block_size_positive')],
            },
        ),
        migrations.CreateModel(
            name='ComparisonSide',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('side', models.CharField(choices=[('a', 'A (cached first)'), ('b', 'B (later)')], max_length=1)),
                ('source', models.CharField(choices=[('record', 'Recorded request'), ('text', 'Text'), ('chat', 'Chat messages'), ('token_ids', 'Token ids')], max_length=10)),
                ('request_id', models.CharField(blank=True, max_length=255)),
                ('arrived_at', models.DateTimeField(blank=True, null=True)),
                ('token_ids', django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), blank=True, null=True, size=None)),
                ('token_strs', django.contrib.postgres.fields.ArrayField(base_field=models.TextField(), blank=True, null=True, size=None)),
                ('tokenizer_used', models.CharField(blank=True, max_length=300)),
                ('tokenizer_warning', models.TextField(blank=True)),
                ('compatibility', models.JSONField(help_text='app.domain.divergence.Compatibility fields')),
                ('comparison', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='sides', to='compare.comparison')),
                ('server', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleet.server')),
            ],
            options={
                'ordering': ['comparison', 'side'],
                'constraints': [models.UniqueConstraint(fields=('comparison', 'side'), name='comparison_side_identity')],
            },
        ),
    ]
