from django.db import models


class Template(models.Model):
    """A prompt template kept in a git repository."""

    name = models.CharField(max_length=200, unique=True)
    repository_url = models.CharField(max_length=500, blank=True)
    path = models.CharField(max_length=500, blank=True, help_text="File of the template in the repository")
    tenant = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TemplateVersion(models.Model):
    """A commit that changed a template."""

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="versions")
    commit_sha = models.CharField(max_length=40)
    committed_at = models.DateTimeField()
    author = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    content = models.TextField(blank=True, help_text="The template's text at this commit")

    class Meta:
        ordering = ["template", "-committed_at"]
        constraints = [
            models.UniqueConstraint(fields=["template", "commit_sha"], name="template_version_identity"),
        ]

    def __str__(self) -> str:
        return f"{self.template.name}@{self.commit_sha[:10]}"


class DeployMarker(models.Model):
    """When a template version went live (optionally on one server only)."""

    template_version = models.ForeignKey(TemplateVersion, on_delete=models.CASCADE, related_name="deploys")
    server = models.ForeignKey("fleet.Server", null=True, blank=True, on_delete=models.CASCADE)
    deployed_at = models.DateTimeField()
    note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-deployed_at"]
        indexes = [models.Index(fields=["deployed_at"], name="deploy_marker_time")]

    def __str__(self) -> str:
        return f"{self.template_version} live at {self.deployed_at:%Y-%m-%d %H:%M}"
