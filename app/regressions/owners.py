"""Who can fix a regression's cause: the owner its alerts are routed to.

A prompt change is fixed by the template's authors (its repository); lost capacity, a routing
change or a restart by the team that runs the servers (the server's group). Alertmanager routes on
the two labels this gives every alert: `owner_kind` and `owner` (deploy/alertmanager/alertmanager.yml).
"""

from dataclasses import dataclass

from app.fleet.models import Server
from app.prompts.models import Template
from app.regressions.models import Regression

TEMPLATE = "template"
PLATFORM = "platform"
PREFIXSCOPE = "prefixscope"
UNOWNED = "unowned"  # a template imported from no repository
DEFAULT_GROUP = "platform"  # the fleet as a whole, or a scope of no one server

# Causes that lie in the servers, not in the prompts: whoever the regression's scope is.
_PLATFORM_KINDS = {
    Regression.Kind.CAPACITY,
    Regression.Kind.ROUTING,
    Regression.Kind.RESTART,
    Regression.Kind.SALT_ROTATION,
}


@dataclass(frozen=True)
class Owner:
    kind: str
    name: str


def template_owner(template: Template | None) -> Owner:
    repository = template.repository if template is not None else None
    return Owner(TEMPLATE, repository.name if repository is not None else UNOWNED)


def server_owner(server: Server | None) -> Owner:
    return Owner(PLATFORM, server.group if server is not None else DEFAULT_GROUP)


def owner_of(regression: Regression) -> Owner:
    """The template's repository for a prompt change (or a drop of a template scope without a
    cause), the server's group for the servers' causes and for server, tenant and fleet scopes."""
    if regression.kind in _PLATFORM_KINDS:
        return server_owner(regression.server)
    if regression.kind == Regression.Kind.TEMPLATE_COMMIT:
        suspect = regression.suspect_version
        return template_owner(suspect.template if suspect is not None else regression.template)
    if regression.template is not None:
        return template_owner(regression.template)
    return server_owner(regression.server)
