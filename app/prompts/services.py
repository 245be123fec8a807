"""The writers of templates and their versions."""

from datetime import datetime

from app.prompts.models import Template, TemplateVersion


def template_version_seen(
    *, template: str, version: str, tenant: str, seen_at: datetime
) -> tuple[Template | None, TemplateVersion | None]:
    """The template named in traffic, and its version; made when first seen.

    A version (commit) not imported yet is recorded as committed when first seen, until the
    repository's import gives its real time, author and message.
    """
    if not template:
        return None, None
    found, _ = Template.objects.get_or_create(name=template, defaults={"tenant": tenant})
    if not version:
        return found, None
    seen, _ = TemplateVersion.objects.get_or_create(
        template=found,
        commit_sha=version,
        defaults={"committed_at": seen_at, "message": "seen in traffic before its commit was imported"},
    )
    return found, seen
