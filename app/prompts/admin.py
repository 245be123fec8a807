from django.contrib import admin

from app.prompts.models import DeployMarker, Template, TemplateRepository, TemplateVersion


@admin.register(TemplateRepository)
class TemplateRepositoryAdmin(admin.ModelAdmin[TemplateRepository]):
    list_display = [
        "name",
        "location",
        "branch",
        "state",
        "commits_imported",
        "commits_total",
        "last_imported_at",
    ]
    # The webhook secret is neither shown nor edited here (the API and manage.py set it).
    exclude = ["webhook_secret"]
    readonly_fields = [
        "state", "commits_imported", "commits_total", "last_error", "last_imported_sha", "last_imported_at",
        "import_started_at",
    ]  # fmt: skip


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin[Template]):
    list_display = ["name", "repository", "path", "tenant", "removed_at"]
    search_fields = ["name", "path"]


@admin.register(TemplateVersion)
class TemplateVersionAdmin(admin.ModelAdmin[TemplateVersion]):
    list_display = ["template", "commit_sha", "committed_at", "author", "imported_at"]
    list_filter = ["template"]
    search_fields = ["commit_sha", "message"]


@admin.register(DeployMarker)
class DeployMarkerAdmin(admin.ModelAdmin[DeployMarker]):
    list_display = ["template_version", "server", "deployed_at", "source"]
