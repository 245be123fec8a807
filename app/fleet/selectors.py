"""Reads of the fleet: what a server serves, as a request's block hashes need it."""

from django.db.models import Case, QuerySet, When

from app.domain.blockhash import LoraKey
from app.fleet.models import Server

UNKNOWN_MODEL_REASON = "model: the server serves no base model or LoRA adapter of that name; no block hashes"
"""The reason under which an ingest counts the requests it stores without a chain for that."""


class UnknownModel(LookupError):
    """A request named a model its server does not list as its base model or as a LoRA adapter."""


def request_lora(server: Server, model: str) -> LoraKey | None:
    """The LoRA adapter vLLM hashed into the blocks of a request that named ``model`` on ``server``.

    As vLLM resolves a request's ``model``: a LoRA adapter the server's /v1/models listed gives
    its name and path; an empty name, the server's model (from /metrics) or another name its base
    model is served under gives None (the base model, no LoRA keys). Reads only the instance's
    fields, no query: callable per request row.

    A server whose /v1/models was never read (not scraped yet, or records arriving first) is taken
    to serve its base model only, as most do: the scrape corrects the requests after it.

    Raises UnknownModel for any other name (an adapter loaded since the last read of /v1/models,
    a typo): hashed without LoRA keys, an adapter's blocks would get a chain that matches no block
    the server holds, so store none for it.
    """
    if model in server.lora_adapters:
        return LoraKey(model, server.lora_adapters[model])
    if not model or model == server.model or model in server.base_models or server.models_read_at is None:
        return None
    raise UnknownModel(f"server {server.name} serves no model {model!r}")


def servers_to_set_up() -> QuerySet[Server]:
    """Every server for the set-up page: the proposed ones first (they wait for a person), then by name."""
    proposed_first = Case(When(state=Server.State.PROPOSED, then=0), default=1)
    return Server.objects.order_by(proposed_first, "name")


def servers(*, state: str = "", model: str = "") -> QuerySet[Server]:
    """Servers by name, of that state and model when given."""
    found = Server.objects.order_by("name")
    if state:
        found = found.filter(state=state)
    if model:
        found = found.filter(model=model)
    return found
