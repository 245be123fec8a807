"""Who sees what: the one place that answers it, for every page, API operation and CSV.

A user belongs to tenants (app/core/models.py Membership). Their `Viewer` filters querysets:

- Admins (superusers, and holders of ``core.view_all_tenants``) and ingest tokens see everything.
- A user of no tenant sees nothing: no server, template, request or regression. An account is
  useful once an admin adds it to a tenant; until then nothing of anyone's leaks to it.
- Servers and templates are things a tenant owns. One with a tenant is seen by that tenant's users;
  one without ("" tenant: not assigned, e.g. a shared server or a template every tenant renders) is
  shared and seen by every user of some tenant, as the Server model's help text always said.
- Traffic (request records, their diagnoses, the loss rollups) belongs to the tenant it names. A row
  without a tenant belongs to its server's or its template's owner: a server or template assigned to
  tenant A carries A's traffic. A tenant-less row of a shared server and a shared template could be
  anyone's, so only admins see it: whatever cannot be attributed is never shown to a tenant.
- The request rollups (per server, template and minute) name no tenant: a tenant sees the rows of
  the servers and templates its tenants own, as above. Its figures on a shared server come from
  the loss rollups, which name the tenant, or from the rows of its own templates. A sum of several
  rows is read only where every row it holds is the viewer's to see: app/rollups/visibility.py
  derives which rows of each sum table that is from the table's keys.
- A regression belongs to its tenant; one without (a server's, a template's or the fleet's) is an
  aggregate of whatever traffic went through its scope, and is seen through its server's or
  template's owner only, else by admins alone (an aggregate of shared traffic is several tenants').

Nothing here reads engine-wide figures (a server's own /metrics counters, its KV events): those are
the server's, seen by whoever sees the server.

A row a viewer may not see is absent, so its page answers 404, never 403: a viewer learns nothing
of another tenant's servers or requests, not even that they exist.
"""

from dataclasses import dataclass
from typing import Final, TypeVar

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, PermissionsMixin
from django.db.models import Model, Q, QuerySet

from app.core.models import Membership

VIEW_ALL_TENANTS: Final = "core.view_all_tenants"
PROPOSED: Final = "proposed"  # app.fleet.models.Server.State.PROPOSED (the fleet app is a layer above)

M = TypeVar("M", bound=Model)


@dataclass(frozen=True, slots=True)
class Viewer:
    """The tenants a viewer sees; None: every tenant (and every row without one)."""

    tenants: frozenset[str] | None

    @property
    def sees_all(self) -> bool:
        return self.tenants is None

    def servers(self, servers: QuerySet[M]) -> QuerySet[M]:
        """Servers: the viewer's tenants' and the shared (unassigned) ones. A proposed server (named
        by some source's data, not registered by a person) is shared by nobody: admins only."""
        return self._filter(servers, self.server_q(prefix=""))

    def server_q(self, prefix: str = "server__") -> Q:
        """servers()'s condition for rows reached through a relation to their server."""
        return Q(**{f"{prefix}tenant__in": self._names}) | (
            Q(**{f"{prefix}tenant": ""}) & ~Q(**{f"{prefix}state": PROPOSED})
        )

    def by_server(self, rows: QuerySet[M]) -> QuerySet[M]:
        """Rows of a server and no tenant (KV streams, gaps, rejected input): those of servers the
        viewer sees; a row of no server, only admins."""
        return self._filter(rows, self.server_q())

    def templates(self, templates: QuerySet[M]) -> QuerySet[M]:
        """Templates: the viewer's tenants' and the shared (unassigned) ones."""
        return self._filter(templates, Q(tenant__in=self._names) | Q(tenant=""))

    def repositories(self, repositories: QuerySet[M]) -> QuerySet[M]:
        """Template repositories holding a template the viewer sees (a repository before its first
        import holds none: admins only)."""
        if not self.tenants:
            return self._filter(repositories, Q())
        templates = repositories.model._meta.get_field("templates").related_model
        seen = self.templates(templates._default_manager.all()).values("repository_id")  # type: ignore[union-attr]
        return repositories.filter(pk__in=seen)

    def families(self, families: QuerySet[M]) -> QuerySet[M]:
        """Prefix families group requests across salts, so across tenants: a tenant sees those whose
        sample request came through a server one of its tenants owns."""
        return self._filter(families, Q(sample_server__tenant__in=self._names))

    def traffic(self, rows: QuerySet[M]) -> QuerySet[M]:
        """Rows with a `tenant`, a `server` and a `template` (records, diagnoses, loss rollups): the
        viewer's tenants', and tenant-less ones of a server or template one of them owns."""
        if not self.tenants:
            return self._filter(rows, Q())
        return rows.filter(Q(tenant__in=self._names) | (Q(tenant="") & self._owned(rows)))

    def _owned(self, rows: QuerySet[M]) -> Q:
        """Of a server or a template one of the viewer's tenants owns: subqueries, not joins, so that
        the explorer's keyset plans stay on the records' own indexes."""
        meta = rows.model._meta
        servers = meta.get_field("server").related_model._default_manager  # type: ignore[union-attr]
        templates = meta.get_field("template").related_model._default_manager  # type: ignore[union-attr]
        return Q(server__in=servers.filter(tenant__in=self._names).values("pk")) | Q(
            template__in=templates.filter(tenant__in=self._names).values("pk")
        )

    def regressions(self, regressions: QuerySet[M]) -> QuerySet[M]:
        """Regressions of the viewer's tenants, or of a server or template one of them owns."""
        untenanted = Q(tenant="")
        owned = Q(server__tenant__in=self._names) | Q(server__isnull=True, template__tenant__in=self._names)
        return self._filter(regressions, Q(tenant__in=self._names) | (untenanted & owned))

    def sees_tenant(self, tenant: str) -> bool:
        """Whether the viewer sees traffic named with this tenant ("" only for admins)."""
        return self.tenants is None or tenant in self.tenants

    @property
    def _names(self) -> list[str]:
        return sorted(self.tenants or ())

    def _filter(self, rows: QuerySet[M], condition: Q) -> QuerySet[M]:
        if self.tenants is None:
            return rows
        if not self.tenants:
            return rows.none()
        return rows.filter(condition)


SEES_ALL: Final = Viewer(tenants=None)
SEES_NOTHING: Final = Viewer(tenants=frozenset())


def sees_all_tenants(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Admins: active superusers, and users holding ``core.view_all_tenants``."""
    return isinstance(user, PermissionsMixin) and user.is_active and user.has_perm(VIEW_ALL_TENANTS)


def viewer_of(user: AbstractBaseUser | AnonymousUser) -> Viewer:
    """What this user may see: everything for an admin, their tenants' for a member, nothing for an
    anonymous or inactive user or one of no tenant."""
    if not user.is_authenticated or not user.is_active:
        return SEES_NOTHING
    if sees_all_tenants(user):
        return SEES_ALL
    return Viewer(frozenset(Membership.objects.filter(user_id=user.pk).values_list("tenant", flat=True)))
