"""The core app's schema, in one migration: what its migrations of 0.1.0 development built."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    # The migrations squashed into this one: a database they made (all of them) is taken as migrated.
    # Delete once no such database is left (see docs/data.md).
    replaces = [
        ('core', '0001_memberships'),
    ]

    initial = True

    dependencies = [
        ('auth', '__first__'),
    ]

    operations = [
        migrations.CreateModel(
            name='Membership',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tenant', models.CharField(help_text="The tenant's name, as its traffic carries it", max_length=100)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['user', 'tenant'],
                'permissions': [('view_all_tenants', "Sees every tenant's servers, traffic and regressions")],
                'constraints': [models.UniqueConstraint(fields=('user', 'tenant'), name='membership_identity'), models.CheckConstraint(condition=models.Q(('tenant', ''), _negated=True), name='membership_tenant_named')],
            },
        ),
    ]
