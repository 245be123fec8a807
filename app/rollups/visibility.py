"""Which rows of a sum table a viewer may read, derived from the table's keys (app/rollups/catalog.py).

The rule is app/core/tenancy.py's: traffic is its tenant's, or (named with no tenant) its server's or
its template's owner's; a server's own readings are whoever sees the server. A row of a sum table
holds many rows of traffic, so a viewer reads it only when it may see every one of them:

- keyed by tenant: a row of one of its tenants, or a tenant-less row of a server or template it owns;
- keyed by no tenant (the request sums): a row of a server or a template it owns;
- a server's own readings: a row of a server it sees.

A sum over fewer keys (per server, per template) serves a viewer where it holds only rows the viewer
sees; the rest of what the viewer sees comes from the table it sums (`visible_sums`). Per-template
sums answer per-template reads, and a viewer reads only templates it sees: both parts are of those.
"""

from dataclasses import dataclass
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet

from app.core.tenancy import Viewer
from app.fleet.models import Server
from app.prompts.models import Template
from app.rollups.catalog import Owner, Rollup, rollup_of

M = TypeVar("M", bound=Model)


def _owned_servers(viewer: Viewer) -> QuerySet[Any]:
    return Server.objects.filter(tenant__in=sorted(viewer.tenants or ())).values("pk")


def _owned_templates(viewer: Viewer) -> QuerySet[Any]:
    return Template.objects.filter(tenant__in=sorted(viewer.tenants or ())).values("pk")


def _whole(rollup: Rollup, viewer: Viewer) -> Q:
    """The rows of `rollup` every summed row of which the viewer sees (a viewer of some tenants)."""
    if rollup.owner == Owner.SERVER:
        return viewer.server_q()
    owned = Q(pk__in=[])
    if "server_id" in rollup.keys:
        owned |= Q(server__in=_owned_servers(viewer))
    if "template_id" in rollup.keys:
        owned |= Q(template__in=_owned_templates(viewer))
    if "tenant" not in rollup.keys:
        return owned
    return Q(tenant__in=sorted(viewer.tenants or ())) | (Q(tenant="") & owned)


def _of_templates_seen(rollup: Rollup, viewer: Viewer) -> Q:
    """A per-template sum's rows are read per template: of the templates the viewer sees."""
    if "template_id" in rollup.keys and "server_id" not in rollup.keys:
        return Q(template__in=viewer.templates(Template.objects.all()).values("pk"))
    return Q()


def visible(viewer: Viewer, rows: QuerySet[M]) -> QuerySet[M]:
    """The rows of a sum table the viewer may read."""
    if viewer.sees_all:
        return rows
    if not viewer.tenants:
        return rows.none()
    return rows.filter(_whole(rollup_of(rows.model), viewer))


def visible_sums(viewer: Viewer, summed: QuerySet[Any], finer: QuerySet[Any]) -> list[QuerySet[Any]]:
    """What the viewer sees of `finer` (a sum table, filtered to a window), read from `summed` (a sum
    of it over fewer keys, filtered alike) where a row holds only rows it sees: the same figures in
    fewer rows. Admins read the sums alone; a viewer of no tenant, nothing."""
    if viewer.sees_all:
        return [summed]
    if not viewer.tenants:
        return []
    coarse, fine = rollup_of(summed.model), rollup_of(finer.model)
    seen = _of_templates_seen(coarse, viewer)
    return [
        summed.filter(_whole(coarse, viewer) & seen),
        finer.filter(_whole(fine, viewer) & seen).exclude(_whole(coarse, viewer)),
    ]


@dataclass(frozen=True, slots=True)
class Condition:
    """A raw-SQL condition over a sum table's columns, with its parameters."""

    sql: str
    params: dict[str, Any]


_TENANTS = "%(viewer_tenants)s"


def _owned_sql(column: str, model: type[Model]) -> str:
    """`column` names a row of `model` (a server, a template) one of the viewer's tenants owns."""
    owned = f"SELECT id FROM {model._meta.db_table} WHERE tenant = ANY({_TENANTS})"
    return f"({column} IS NOT NULL AND {column} IN ({owned}))"


def _whole_sql(rollup: Rollup) -> str:
    """_whole() in SQL, over the table's own columns."""
    if rollup.owner == Owner.SERVER:
        table = Server._meta.db_table
        return (
            f"server_id IN (SELECT id FROM {table} WHERE tenant = ANY({_TENANTS})"
            f" OR (tenant = '' AND state <> '{Server.State.PROPOSED}'))"
        )
    owned = ["false"]
    if "server_id" in rollup.keys:
        owned.append(_owned_sql("server_id", Server))
    if "template_id" in rollup.keys:
        owned.append(_owned_sql("template_id", Template))
    either = " OR ".join(owned)
    if "tenant" not in rollup.keys:
        return f"({either})"
    return f"(tenant = ANY({_TENANTS}) OR (tenant = '' AND ({either})))"


def _of_templates_seen_sql(rollup: Rollup) -> str:
    if "template_id" in rollup.keys and "server_id" not in rollup.keys:
        table = Template._meta.db_table
        return f"template_id IN (SELECT id FROM {table} WHERE tenant = ANY({_TENANTS}) OR tenant = '')"
    return "true"


def visible_sql(viewer: Viewer, model: type[Model]) -> Condition:
    """visible() as a raw-SQL condition over the table's columns."""
    if viewer.sees_all:
        return Condition("true", {})
    if not viewer.tenants:
        return Condition("false", {})
    return Condition(_whole_sql(rollup_of(model)), {"viewer_tenants": sorted(viewer.tenants)})


def visible_sums_sql(viewer: Viewer, summed: type[Model], finer: type[Model]) -> tuple[Condition, Condition]:
    """visible_sums() as raw-SQL conditions: over `summed`'s columns, and over `finer`'s ("false"
    where no row of it is read)."""
    if viewer.sees_all:
        return Condition("true", {}), Condition("false", {})
    if not viewer.tenants:
        return Condition("false", {}), Condition("false", {})
    coarse, fine = rollup_of(summed), rollup_of(finer)
    seen, params = _of_templates_seen_sql(coarse), {"viewer_tenants": sorted(viewer.tenants)}
    return (
        Condition(f"{_whole_sql(coarse)} AND {seen}", params),
        Condition(f"{_whole_sql(fine)} AND {seen} AND NOT {_whole_sql(coarse)}", params),
    )
