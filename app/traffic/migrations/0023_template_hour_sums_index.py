"""The hour rollups' index on (template, hour) made covering: it holds the server and the totals the
Templates list sums, so that a week of every template is read from the index alone."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0004_server_num_gpu_blocks'),
        ('prompts', '0006_template_regression_min_drop'),
        ('traffic', '0022_server_loss_quarters'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='hourrollup',
            name='hour_rollup_template_time',
        ),
        migrations.AddIndex(
            model_name='hourrollup',
            index=models.Index(fields=['template', 'hour'], include=('server', 'requests', 'prompt_tokens', 'cached_tokens', 'cache_known_prompt_tokens'), name='hour_rollup_template_sums'),
        ),
    ]
