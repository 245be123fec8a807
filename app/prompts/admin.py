from django.contrib import admin

from app.prompts.models import DeployMarker, Template, TemplateVersion


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin[Template]):
    list_display = ["name", "repository_url", "path", "tenant"]
    search_fields = ["name", "path"]


@admin.register(TemplateVersion)
class TemplateVersionAdmin(admin.ModelAdmin[TemplateVersion]):
    list_display = ["template", "commit_sha", "committed_at", "author"]
    list_filter = ["template"]
    search_fields = ["commit_sha", "message"]


@admin.register(DeployMarker)
class DeployMarkerAdmin(admin.ModelAdmin[DeployMarker]):
    list_display = ["template_version", "server", "deployed_at"]
