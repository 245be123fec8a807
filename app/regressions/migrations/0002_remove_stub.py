# The first Regression model was a placeholder no code wrote: replaced whole by 0003.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("regressions", "0001_initial"),
    ]

    operations = [
        migrations.DeleteModel(name="Regression"),
    ]
