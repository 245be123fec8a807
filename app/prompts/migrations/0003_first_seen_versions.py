"""Versions stored before template imports were all named by traffic first (committed_at is when
they were first seen): they get their first-seen time and its deploy marker."""

from django.db import migrations


def mark_first_seen(apps, schema_editor):
    TemplateVersion = apps.get_model("prompts", "TemplateVersion")
    DeployMarker = apps.get_model("prompts", "DeployMarker")
    for version in TemplateVersion.objects.filter(first_seen_at__isnull=True, imported_at__isnull=True):
        version.first_seen_at = version.committed_at
        version.save(update_fields=["first_seen_at"])
        DeployMarker.objects.create(
            template_version=version, deployed_at=version.committed_at, source="traffic",
            note="the first request naming this version",
        )


class Migration(migrations.Migration):
    dependencies = [("prompts", "0002_template_repositories")]

    operations = [migrations.RunPython(mark_first_seen, migrations.RunPython.noop)]
