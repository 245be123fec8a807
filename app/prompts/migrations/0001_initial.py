"""The prompts app's schema, in one migration: what its migrations of 0.1.0 development built."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    # The migrations squashed into this one: a database they made (all of them) is taken as migrated.
    # Their 0001_initial is not listed: this one took its name, and none can replace itself.
    # Delete once no such database is left (see docs/data.md).
    replaces = [
        ('prompts', '0002_template_repositories'),
        ('prompts', '0003_first_seen_versions'),
        ('prompts', '0004_cache_killers'),
        ('prompts', '0005_prefix_families'),
        ('prompts', '0006_template_regression_min_drop'),
    ]

    initial = True

    dependencies = [
        ('fleet', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='TemplateRepository',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True)),
                ('location', models.CharField(help_text='An absolute local path, or an http(s):// or file:// URL', max_length=1000, unique=True)),
                ('globs', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=300), help_text='Template files, git wildmatch patterns: templates/*.j2', size=None)),
                ('branch', models.CharField(blank=True, help_text='The branch or ref followed; blank: HEAD', max_length=200)),
                ('webhook_secret', models.CharField(blank=True, max_length=200)),
                ('state', models.CharField(choices=[('idle', 'Idle'), ('queued', 'Queued'), ('running', 'Importing'), ('failed', 'Failed')], default='idle', max_length=10)),
                ('commits_imported', models.PositiveIntegerField(default=0, help_text='Commits read so far by the last import')),
                ('commits_total', models.PositiveIntegerField(default=0, help_text='Commits the last import had to read')),
                ('last_error', models.TextField(blank=True)),
                ('last_imported_sha', models.CharField(blank=True, max_length=40)),
                ('last_imported_at', models.DateTimeField(blank=True, null=True)),
                ('import_started_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'verbose_name_plural': 'template repositories',
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='Template',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True)),
                ('path', models.CharField(blank=True, help_text='File of the template in the repository', max_length=500)),
                ('tenant', models.CharField(blank=True, max_length=100)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('removed_at', models.DateTimeField(blank=True, help_text='When a commit deleted its file (or moved it out of the globs)', null=True)),
                ('repository', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='templates', to='prompts.templaterepository')),
                ('regression_min_drop', models.FloatField(blank=True, help_text="Hit-rate drop that opens a regression; blank: the setting's", null=True)),
            ],
            options={
                'ordering': ['name'],
                'constraints': [models.UniqueConstraint(condition=models.Q(('repository__isnull', False)), fields=('repository', 'path'), name='template_file_identity')],
            },
        ),
        migrations.CreateModel(
            name='TemplateVersion',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('commit_sha', models.CharField(max_length=40)),
                ('committed_at', models.DateTimeField()),
                ('author', models.CharField(blank=True, max_length=200)),
                ('message', models.TextField(blank=True)),
                ('content', models.TextField(blank=True, help_text="The template's text at this commit")),
                ('template', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='versions', to='prompts.template')),
                ('author_email', models.CharField(blank=True, max_length=200)),
                ('diff', models.TextField(blank=True, help_text="Unified diff against the file in the commit's first parent")),
                ('first_seen_at', models.DateTimeField(blank=True, help_text='The first request that named it', null=True)),
                ('imported_at', models.DateTimeField(blank=True, null=True)),
                ('path', models.CharField(blank=True, help_text="The template's file at this commit", max_length=500)),
                ('tags', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=200), blank=True, default=list, size=None)),
            ],
            options={
                'ordering': ['template', '-committed_at'],
                'constraints': [models.UniqueConstraint(fields=('template', 'commit_sha'), name='template_version_identity')],
            },
        ),
        migrations.CreateModel(
            name='DeployMarker',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('deployed_at', models.DateTimeField()),
                ('note', models.CharField(blank=True, max_length=500)),
                ('server', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, to='fleet.server')),
                ('template_version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deploys', to='prompts.templateversion')),
                ('source', models.CharField(choices=[('api', 'Deploy API'), ('traffic', 'First request naming it')], default='api', max_length=10)),
            ],
            options={
                'ordering': ['-deployed_at'],
                'indexes': [models.Index(fields=['deployed_at'], name='deploy_marker_time')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('source', 'traffic')), fields=('template_version',), name='deploy_marker_first_seen')],
            },
        ),
        migrations.CreateModel(
            name='PrefixFamily',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('model', models.CharField(max_length=255)),
                ('block_size', models.PositiveIntegerField()),
                ('key', models.BigIntegerField()),
                ('blocks', models.PositiveSmallIntegerField(help_text='Leading full blocks the key covers')),
                ('first_seen_at', models.DateTimeField()),
                ('last_seen_at', models.DateTimeField()),
                ('requests', models.PositiveIntegerField(default=0, help_text='Approximate: counted per ingested batch')),
                ('sample_request_id', models.CharField(blank=True, max_length=255)),
                ('name', models.CharField(blank=True, max_length=200)),
                ('bound_at', models.DateTimeField(blank=True, help_text='Requests after it carry the template', null=True)),
                ('sample_server', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='fleet.server')),
                ('template', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='families', to='prompts.template')),
            ],
            options={
                'verbose_name_plural': 'prefix families',
                'ordering': ['-requests', '-last_seen_at'],
                'constraints': [models.UniqueConstraint(fields=('model', 'block_size', 'key'), name='prefix_family_identity')],
            },
        ),
        migrations.CreateModel(
            name='CacheKiller',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('salt_hash', models.CharField(blank=True, help_text='sha256 of the cache salt; blank: none', max_length=64)),
                ('model', models.CharField(blank=True, max_length=255)),
                ('block_size', models.PositiveIntegerField()),
                ('computed_at', models.DateTimeField()),
                ('window_start', models.DateTimeField()),
                ('window_end', models.DateTimeField()),
                ('mode', models.CharField(choices=[('tokens', 'Token ids'), ('hashes', 'Block hashes only')], max_length=10)),
                ('position_token', models.PositiveIntegerField(blank=True, help_text='Null in hash-only mode', null=True)),
                ('block_index', models.PositiveIntegerField(help_text='The block the position is in')),
                ('kind', models.CharField(choices=[('timestamp', 'Timestamp or date'), ('id', 'Id (uuid, hex, request or trace id)'), ('number', 'Counter or number'), ('reordered_items', 'Reordered items'), ('json_key_order', 'JSON key order'), ('whitespace_drift', 'Whitespace drift'), ('per_user', 'Per-user data in a shared part'), ('rotating_examples', 'Rotating few-shot examples'), ('varying_text', 'Varying text'), ('unclassified', 'Unclassified (no text)')], max_length=20)),
                ('requests', models.PositiveIntegerField(help_text='Requests sharing the prefix up to the position')),
                ('requests_affected', models.PositiveIntegerField(help_text='Of them, those losing a block or more')),
                ('continuations', models.PositiveIntegerField(help_text='Distinct continuations after the position')),
                ('tokens_lost', models.BigIntegerField(help_text='Prompt tokens a stable text there would have reused')),
                ('straddle_tokens', models.PositiveSmallIntegerField(blank=True, help_text="Tokens of the position's block before it, recomputed anyway", null=True)),
                ('samples', models.JSONField(blank=True, default=list, help_text='Keys of requests that vary there')),
                ('template', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='killers', to='prompts.template')),
            ],
            options={
                'ordering': ['template', '-tokens_lost', 'block_index'],
                'permissions': [('read_prompt_text', 'Can read prompt text (the samples of cache killers)')],
                'indexes': [models.Index(fields=['template', '-tokens_lost'], name='cache_killer_template_cost')],
            },
        ),
    ]
