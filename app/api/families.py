"""Prefix families: requests without template metadata grouped by their leading blocks, named and
bound to a template here. Binding affects the requests ingested after it only.

Authenticated as app/api/templates.py: reads by a logged-in user's session or an ingest token,
writes by a staff user's session (with X-CSRFToken) or an ingest token.
"""

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Router, Schema
from ninja.pagination import paginate

from app.api.auth import READ_AUTH, READERS, WRITE_AUTH, WRITERS
from app.api.errors import ApiError, error
from app.api.pages import Pages
from app.api.viewers import caller_viewer
from app.prompts import selectors, services
from app.prompts.models import PrefixFamily, Template

router = Router(tags=["families"])


class FamilyIn(Schema):
    name: str | None = Field(None, max_length=200, description="Blank: unnamed; absent: unchanged")
    template_id: int | None = Field(
        None, description="The template later requests carry; null: unbound; absent: unchanged"
    )


class SampleOut(Schema):
    server: str
    request_id: str


class FamilyOut(Schema):
    id: int
    name: str
    model: str
    block_size: int
    blocks: int = Field(description="Leading full blocks the key covers")
    key: str = Field(description="The salt-neutral hash of the last of those blocks, 16 hex digits")
    first_seen_at: datetime
    last_seen_at: datetime
    requests: int = Field(description="Approximate: counted per ingested batch")
    template_id: int | None = Field(description="The template requests ingested after bound_at carry")
    bound_at: datetime | None
    sample: SampleOut | None = Field(description="The request that made the family")

    @staticmethod
    def resolve_key(family: PrefixFamily) -> str:
        return f"{family.key % 2**64:016x}"  # as the wire hash: stored signed

    @staticmethod
    def resolve_sample(family: PrefixFamily) -> SampleOut | None:
        server = family.sample_server
        return SampleOut(server=server.name, request_id=family.sample_request_id) if server else None


@router.get(
    "/families",
    auth=READERS,
    response=list[FamilyOut],
    summary="Prefix families, most requests first",
    description=READ_AUTH,
    url_name="families",
)
@paginate(Pages)
def list_families(request: HttpRequest) -> Any:
    return selectors.families(viewer=caller_viewer(request))  # sliced by the pagination: one page read


@router.patch(
    "/families/{family_id}",
    auth=WRITERS,
    response={200: FamilyOut, 404: ApiError},
    summary="Name a prefix family, bind it to a template",
    description="Fields left out are unchanged; `template_id: null` unbinds. Requests ingested from then "
    "on carry the template; requests stored before keep theirs. 404: no such family or template. "
    + WRITE_AUTH,
    url_name="family",
)
def update_family(request: HttpRequest, family_id: int, body: FamilyIn) -> Any:
    viewer = caller_viewer(request)
    family = selectors.families(viewer=viewer).filter(pk=family_id).first()
    if family is None:
        return error(404, "no such family")
    given = body.model_fields_set
    template = family.template
    if "template_id" in given:
        templates = viewer.templates(Template.objects.all())
        template = templates.filter(pk=body.template_id).first() if body.template_id else None
        if body.template_id and template is None:
            return error(404, "no such template")
    name = body.name if "name" in given and body.name is not None else family.name
    return services.name_family(family, name=name, template=template, now=timezone.now())
