"""Compare two prompts over REST: the divergence as JSON, and the permalink that shows it.

For logged-in users (the session cookie, with Django's CSRF token on POST). Prompt content is
not in the answers: positions, counts, edits, hashes and compatibility records only.
"""

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from pydantic import model_validator

from app.api.auth import READERS
from app.api.errors import ApiError, error
from app.api.schemas import Instant
from app.api.viewers import caller_viewer
from app.compare import selectors
from app.compare.models import Comparison
from app.compare.results import Result, comparison_result
from app.compare.services import MAX_BLOCK_SIZE, ComparisonError, SideInput, create_comparison
from app.compare.summary import Estimate
from app.compare.tokenization import MAX_TOKEN_ID, Prompt, PromptError
from app.core.tenancy import Viewer
from app.domain.divergence import Side
from app.fleet.models import Server

router = Router(tags=["compare"], auth=READERS)


class RequestKeyIn(Schema):
    server: str = Field(description="The server's name")
    request_id: str = Field(min_length=1, max_length=255)
    arrived_at: Instant = Field(description="The record's arrival time, exactly as stored (ISO 8601)")


class ChatMessage(Schema):
    role: str
    content: str


class SideIn(Schema):
    """Exactly one of ``text``, ``messages``, ``token_ids``, ``request``; or, for side a only,
    ``previous: true``: the earlier request b could best have reused from (on b's server, under
    b's cache salt and model, the one sharing the most leading blocks with b, else the latest)."""

    text: str | None = Field(None, description="A completion prompt")
    messages: list[ChatMessage] | None = Field(
        None, description="Chat messages; the model's chat template applies"
    )
    token_ids: list[int] | None = Field(None, description="Token ids, as vLLM would receive them")
    request: RequestKeyIn | None = Field(None, description="A recorded request")
    previous: bool = Field(
        False,
        description="Side a only: the earlier request on b's server, under b's cache salt and model, "
        "that shares the most leading blocks with b (the latest of those that share as much)",
    )
    cache_salt: str | None = Field(None, max_length=1024, description="Prompts only; hashed, never stored")
    lora_adapter: str | None = Field(None, max_length=255, description="Prompts only")

    @model_validator(mode="after")
    def one_input(self) -> "SideIn":
        given = [
            self.text is not None,
            self.messages is not None,
            self.token_ids is not None,
            self.request is not None,
        ]
        if sum(given) + self.previous != 1:
            raise ValueError("give exactly one of text, messages, token_ids, request or previous")
        if self.token_ids is not None and any(not 0 <= t <= MAX_TOKEN_ID for t in self.token_ids):
            raise ValueError(f"token ids are between 0 and {MAX_TOKEN_ID}")
        return self


class CompareIn(Schema):
    a: SideIn = Field(description="The prompt cached first")
    b: SideIn = Field(description="The later prompt, whose reuse of a's blocks is measured")
    server: str | None = Field(None, description="The server whose /tokenize, block size and hash apply")
    model: str | None = Field(None, description="Without a server: any server of this model tokenizes")
    block_size: int | None = Field(
        None, ge=1, le=MAX_BLOCK_SIZE, description="Default: b's server's, else 16"
    )
    include_blocks: bool = Field(False, description="List every block of both sides with its hash")

    @model_validator(mode="after")
    def previous_of_a_request(self) -> "CompareIn":
        if self.b.previous:
            raise ValueError("previous is for side a only")
        if self.a.previous and self.b.request is None:
            raise ValueError("a: previous needs b to be a recorded request")
        return self


class EditOut(Schema):
    kind: Literal["inserted", "deleted", "replaced"]
    a_start: int
    a_end: int
    b_start: int
    b_end: int


class BlockOut(Schema):
    index: int
    start: int
    end: int
    wire_hash: int | None = Field(description="uint64 as in KV events; null when not reproducible")
    status: Literal["shared", "diverged", "partial_tail"]


class CompatibilityOut(Schema):
    model: str
    tokenizer: str | None
    lora_adapter: str | None
    template: str | None
    template_version: str | None
    tenant_salt: str | None = Field(description="sha256 of the cache salt")
    kv_cache_dtype: str | None
    hash_algo: str | None


class SideOut(Schema):
    source: Literal["record", "text", "chat", "token_ids"]
    label: str
    length: int | None
    tokenizer_used: str
    warning: str = Field(description="Why the token ids may not be the server's; empty when they are")
    missing: str = Field(description="Why the token ids are not available; empty when they are")
    compatibility: CompatibilityOut


class EstimateOut(Schema):
    seconds_per_token: float
    basis: str = Field(description="Measured TTFT slope or the assumed prefill rate")
    ttft_seconds: float = Field(description="Extra TTFT of one request like b")
    gpu_seconds_per_1000: float
    usd_per_1000: float


class CompareOut(Schema):
    slug: str | None = Field(description="Null when the prompts' token ids may not be kept")
    permalink: str | None
    precision: Literal["token", "block"] | None = Field(
        description="block: hash-only records; null: no comparison"
    )
    problem: str
    block_size: int
    a: SideOut
    b: SideOut
    identical: bool | None
    first_divergence: int | None = Field(description="0-based index of the first differing token")
    first_divergent_block: int | None
    common_prefix: int | None
    reusable_tokens: int | None = Field(description="The cached_tokens vLLM would report for b")
    wasted_prefill_tokens: int | None
    shared_blocks: int | None
    blocked_by: list[str]
    notes: list[str]
    edits: list[EditOut]
    edits_exact: bool | None
    estimate: EstimateOut | None
    blocks: dict[str, list[BlockOut]] | None = Field(description="With include_blocks: a's and b's blocks")

    @classmethod
    def from_result(
        cls, result: Result, *, permalink: str | None, estimate: Estimate | None, include_blocks: bool
    ) -> "CompareOut":
        """The answer for a computed comparison. Token-precision fields (identical, the first
        differing token, the common prefix, notes, edits) are null or empty at block precision,
        and every figure is when nothing could be compared (``problem`` says why)."""
        d, f = result.divergence, result.figures
        sides: tuple[Side, Side] = ("a", "b")
        return cls(
            slug=result.slug or None,
            permalink=permalink,
            precision=f.precision if f else None,
            problem=result.problem,
            block_size=result.block_size,
            a=SideOut.model_validate(result.a),
            b=SideOut.model_validate(result.b),
            identical=d.identical if d else None,
            first_divergence=d.first_divergence if d else None,
            first_divergent_block=f.first_divergent_block if f else None,
            common_prefix=d.common_prefix if d else None,
            reusable_tokens=f.reusable_tokens if f else None,
            wasted_prefill_tokens=f.wasted_prefill_tokens if f else None,
            shared_blocks=f.shared_blocks if f else None,
            blocked_by=list(f.blocked_by) if f else [],
            notes=list(d.notes) if d else [],
            edits=[EditOut.model_validate(edit) for edit in d.edits] if d else [],
            edits_exact=d.edits_exact if d else None,
            estimate=EstimateOut.model_validate(estimate) if estimate else None,
            blocks={side: [BlockOut.model_validate(b) for b in result.blocks(side)] for side in sides}
            if include_blocks and d
            else None,
        )


class BlocksQuery(Schema):
    include_blocks: bool = False


@router.post(
    "/compare",
    response={200: CompareOut, 400: ApiError},
    summary="Compare two prompts",
    description="Where a later prompt b stops reusing the prefix cache of a cached prompt a, as vLLM "
    "decides it. Saves a permalink when the prompts' token ids may be kept (token retention). "
    "Authenticated by the session cookie of a logged-in user; send Django's CSRF token as X-CSRFToken.",
    url_name="compare-post",
)
def compare(request: HttpRequest, body: CompareIn) -> Any:
    now, viewer = timezone.now(), caller_viewer(request)
    try:
        server = _server(body.server, viewer)
        a, b = _side(body.a, viewer, previous_of=body.b), _side(body.b, viewer)
        compared = create_comparison(
            a=a, b=b, server=server, model=body.model or "", block_size=body.block_size,
            created_by=request.user, now=now,
        )  # fmt: skip
    except (ComparisonError, PromptError) as exc:
        return error(400, str(exc))
    result = comparison_result(compared.comparison, compared.sides, now=now)
    return _answer(request, result, include_blocks=body.include_blocks, now=now)


@router.get(
    "/compare/{slug}",
    response={200: CompareOut, 404: ApiError},
    summary="A saved comparison",
    description="Recomputed from its sides: a recorded request past retention, or a pasted prompt "
    "past token retention, makes it block-precise or says what is missing.",
    url_name="compare-get",
)
def get_comparison(request: HttpRequest, slug: str, query: Query[BlocksQuery]) -> Any:
    try:
        comparison = selectors.comparison(slug, viewer=caller_viewer(request), user_id=request.user.pk)
    except Comparison.DoesNotExist:
        return error(404, "no such comparison")
    now = timezone.now()
    result = comparison_result(comparison, selectors.comparison_sides(comparison), now=now)
    return _answer(request, result, include_blocks=query.include_blocks, now=now)


def _server(name: str | None, viewer: Viewer) -> Server | None:
    if not name:
        return None
    server = viewer.servers(Server.objects.filter(name=name)).first()
    if server is None:
        raise ComparisonError(f"no server named {name!r}")
    return server


def _side(side: SideIn, viewer: Viewer, *, previous_of: SideIn | None = None) -> SideInput:
    if side.request is not None:
        return SideInput(record=_key(side.request, viewer))
    if side.previous:
        return _previous(previous_of, viewer)
    if side.text is not None:
        prompt = Prompt(text=side.text)
    elif side.messages is not None:
        prompt = Prompt(messages=tuple({"role": m.role, "content": m.content} for m in side.messages))
    else:
        prompt = Prompt(token_ids=tuple(side.token_ids or ()))
    return SideInput(prompt=prompt, cache_salt=side.cache_salt, lora_adapter=side.lora_adapter)


def _key(request: RequestKeyIn, viewer: Viewer) -> selectors.RecordKey:
    """The key of a recorded request the caller sees; another tenant's is answered as a missing one."""
    server = _server(request.server, viewer)
    assert server is not None
    key = selectors.RecordKey(server.pk, request.request_id, request.arrived_at)
    if selectors.request_record(key, viewer=viewer) is None:
        raise ComparisonError(f"no request {key.request_id!r} recorded at {key.arrived_at.isoformat()}")
    return key


def _previous(later: SideIn | None, viewer: Viewer) -> SideInput:
    assert later is not None and later.request is not None  # CompareIn checked it
    previous = selectors.previous_request_key(_key(later.request, viewer), viewer=viewer)
    if previous is None:
        raise ComparisonError("there is no earlier request on b's server under b's cache salt and model")
    return SideInput(record=previous)


def _answer(request: HttpRequest, result: Result, *, include_blocks: bool, now: datetime) -> CompareOut:
    url = reverse("compare:detail", args=[result.slug]) if result.slug else None
    return CompareOut.from_result(
        result,
        permalink=request.build_absolute_uri(url) if url else None,
        estimate=result.estimate(selectors.prefill_slope(result.cost_server, now=now)),
        include_blocks=include_blocks,
    )
