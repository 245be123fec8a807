from django.db.models import QuerySet

from app.core.tenancy import SEES_ALL, Viewer
from app.prompts.models import TemplateVersion
from app.regressions.models import Regression

STATES = ("active", "all", *Regression.State.values)
"""What a list of regressions can be filtered by: active (not resolved), all, or one state."""


def regressions(
    *, state: str = "active", scope: str = "", metric: str = "", kind: str = "", viewer: Viewer = SEES_ALL
) -> QuerySet[Regression]:
    """Regressions the viewer sees, newest change first; `state` "active" (not resolved), "all" or one
    state."""
    found = viewer.regressions(Regression.objects.all()).select_related(
        "template", "server", "suspect_version", "noted_by"
    )
    if state == "active":
        found = found.exclude(state=Regression.State.RESOLVED)
    elif state != "all":
        found = found.filter(state=state)
    if scope:
        found = found.filter(scope=scope)
    if metric:
        found = found.filter(metric=metric)
    if kind:
        found = found.filter(kind=kind)
    return found.order_by("-changed_at", "-id")


def reverts_of(version: TemplateVersion) -> list[int]:
    """The template's versions committed after `version` whose text is the text just before it: the
    commits that reverted it. None when the version before it is unknown or its text was not imported."""
    versions = TemplateVersion.objects.filter(template_id=version.template_id)
    earlier = versions.filter(committed_at__lt=version.committed_at).order_by("-committed_at")
    before = earlier.values_list("content", flat=True).first()
    if not before:
        return []
    later = versions.filter(committed_at__gt=version.committed_at, content=before)
    return list(later.values_list("pk", flat=True))
