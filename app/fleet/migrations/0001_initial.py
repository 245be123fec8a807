"""The fleet app's schema, in one migration: what its migrations of 0.1.0 development built."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    # The migrations squashed into this one: a database they made (all of them) is taken as migrated.
    # Their 0001_initial is not listed: this one took its name, and none can replace itself.
    # Delete once no such database is left (see docs/data.md).
    replaces = [
        ('fleet', '0002_scrape_schedule'),
        ('fleet', '0003_served_models'),
        ('fleet', '0004_server_num_gpu_blocks'),
        ('fleet', '0005_server_alias'),
        ('fleet', '0006_server_group'),
    ]

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Server',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.SlugField(max_length=100, unique=True)),
                ('base_url', models.URLField(help_text='OpenAI-compatible API root, e.g. http://vllm-0:8000')),
                ('metrics_url', models.URLField(blank=True, help_text='Defaults to <base_url>/metrics')),
                ('kv_events_endpoint', models.CharField(blank=True, help_text='ZMQ PUB, tcp://host:5557', max_length=255)),
                ('kv_replay_endpoint', models.CharField(blank=True, help_text='ZMQ ROUTER, tcp://host:5558', max_length=255)),
                ('kv_topic', models.CharField(blank=True, max_length=255)),
                ('model', models.CharField(blank=True, max_length=255)),
                ('block_size', models.PositiveIntegerField(blank=True, null=True)),
                ('hash_algo', models.CharField(blank=True, max_length=50)),
                ('tenant', models.CharField(blank=True, help_text='Tenant whose users may see it; blank: all', max_length=100)),
                ('state', models.CharField(choices=[('proposed', 'Proposed'), ('active', 'Active'), ('down', 'Down'), ('disabled', 'Disabled')], default='active', max_length=10)),
                ('scrape_interval_seconds', models.PositiveIntegerField(default=15)),
                ('last_scraped_at', models.DateTimeField(blank=True, null=True)),
                ('discovered_at', models.DateTimeField(blank=True, help_text='When block size was last read', null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('next_scrape_at', models.DateTimeField(blank=True, help_text='When the dispatcher sends the next pull', null=True)),
                ('base_models', models.JSONField(blank=True, default=list, help_text='The names the base model is served under, per /v1/models')),
                ('lora_adapters', models.JSONField(blank=True, default=dict, help_text='LoRA adapters served, {name: path}, per /v1/models')),
                ('models_read_at', models.DateTimeField(blank=True, help_text='When /v1/models was last read', null=True)),
                ('num_gpu_blocks', models.PositiveIntegerField(blank=True, help_text="KV blocks of one engine, vLLM's null block included (cache_config_info)", null=True)),
                ('group', models.SlugField(db_default='platform', default='platform', help_text='The team that runs it: its alerts are routed to it', max_length=100)),
            ],
            options={
                'ordering': ['name'],
                'constraints': [models.CheckConstraint(condition=models.Q(('block_size__isnull', True), ('block_size__gt', 0), _connector='OR'), name='server_block_size_positive')],
            },
        ),
        migrations.CreateModel(
            name='ServerAlias',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.SlugField(max_length=100, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('server', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='aliases', to='fleet.server')),
            ],
        ),
    ]
