"""Reads of the what-if questions kept."""

from django.db.models import QuerySet

from app.core.tenancy import Viewer
from app.whatif.models import WhatIfQuestion


def questions(*, viewer: Viewer, scope: str = "", name: str | None = None) -> QuerySet[WhatIfQuestion]:
    """The questions `viewer` may read, newest first: those asked under the same tenants (their
    answers count those tenants' requests), every one for a viewer who sees all. Narrowed to a
    scope kind and name when given."""
    found = WhatIfQuestion.objects.order_by("-asked_at", "-pk")
    if not viewer.sees_all:
        # A question of other tenants is absent, as any row a viewer may not see (404, not 403).
        found = found.filter(tenants=sorted(viewer.tenants or ()))
    if scope:
        found = found.filter(scope=scope)
    if name is not None:
        found = found.filter(name=name)
    return found
