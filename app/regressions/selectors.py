from django.db.models import QuerySet

from app.regressions.models import Regression

STATES = ("active", "all", *Regression.State.values)
"""What a list of regressions can be filtered by: active (not resolved), all, or one state."""


def regressions(*, state: str = "active", scope: str = "", kind: str = "") -> QuerySet[Regression]:
    """Regressions newest change first; `state` "active" (not resolved), "all" or one state."""
    found = Regression.objects.select_related("template", "server", "suspect_version", "noted_by")
    if state == "active":
        found = found.exclude(state=Regression.State.RESOLVED)
    elif state != "all":
        found = found.filter(state=state)
    if scope:
        found = found.filter(scope=scope)
    if kind:
        found = found.filter(kind=kind)
    return found.order_by("-changed_at", "-id")
