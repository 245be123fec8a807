from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from app.compare import selectors
from app.compare.display import Reveal
from app.compare.forms import ExplorerFilter, PromptPairForm, RecordPairForm, pair_form
from app.compare.models import Comparison
from app.compare.results import Result, comparison_result
from app.compare.services import ComparisonError, create_comparison
from app.core.http import HtmxHttpRequest
from app.core.tenancy import Viewer, viewer_of
from app.prompts.killers import may_read_prompts


@login_required
@require_http_methods(["GET", "POST"])
def start(request: HtmxHttpRequest) -> HttpResponse:
    """Pick two recorded requests or paste two prompts. A valid POST saves the comparison and goes
    to its permalink, or shows it at once when the prompts' tokens may not be kept."""
    viewer = viewer_of(request.user)
    form = pair_form(request.POST, viewer=viewer) if request.method == "POST" else None
    if form is not None and form.is_valid():
        now = timezone.now()
        try:
            compared = create_comparison(**form.comparison_args(), created_by=request.user, now=now)
        except ComparisonError as exc:
            form.add_error(None, str(exc))
        else:
            if compared.saved:
                return redirect(compared.comparison)
            result = comparison_result(
                compared.comparison, compared.sides, now=now, reads_prompts=may_read_prompts(request.user)
            )
            return render(request, "compare/result.html", _result_context(result, None, now=now))
    # The paste form has a "server" field too: the explorer's ids are prefixed.
    explorer = ExplorerFilter(request.GET or None, auto_id="id_explorer_%s", viewer=viewer)
    template = "compare/compare.html" + ("#request-list" if request.htmx else "")
    return render(request, template, _start_context(form, explorer, viewer=viewer, user_id=request.user.pk))


@login_required
@require_GET
def detail(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    """A comparison's permalink. ``side``, ``start`` and ``end`` open a fold: htmx gets the opened
    stretch alone (#token-run), a plain request the page with that stretch open."""
    try:
        comparison = selectors.comparison(slug, viewer=viewer_of(request.user), user_id=request.user.pk)
    except Comparison.DoesNotExist:
        raise Http404("no such comparison") from None
    now = timezone.now()
    result = comparison_result(
        comparison,
        selectors.comparison_sides(comparison),
        now=now,
        reads_prompts=may_read_prompts(request.user),
    )
    reveal = _reveal(request.GET, result)
    if request.htmx and reveal is not None:
        run = result.layout.expand(reveal.side, reveal.start, reveal.end)
        return render(request, "compare/result.html#token-run", {"run": run, "result": result})
    return render(request, "compare/result.html", _result_context(result, reveal, now=now))


def _reveal(query: QueryDict, result: Result) -> Reveal | None:
    try:
        reveal = Reveal(query.get("side", ""), int(query.get("start", "")), int(query.get("end", "")))
    except ValueError:
        return None
    if result.divergence is None or not result.tokens_shown:
        return None
    if not result.layout.in_range(reveal.side, reveal.start, reveal.end):
        return None
    return reveal


def _result_context(result: Result, reveal: Reveal | None, *, now: datetime) -> dict[str, Any]:
    drawn = result.divergence is not None and result.tokens_shown  # the token stream shows token text
    segments = result.layout.segments(reveal) if drawn else []
    bar = result.layout.bar() if drawn else []
    slope = selectors.prefill_slope(result.cost_server, now=now)
    return {
        "result": result,
        "figures": result.figures,
        "estimate": result.estimate(slope),
        "segments": segments,
        "bar": bar,
        "gpu_hour_usd": settings.PREFIXSCOPE_GPU_HOUR_PRICE,
    }


def _start_context(
    form: RecordPairForm | PromptPairForm | None,
    explorer: ExplorerFilter,
    *,
    viewer: Viewer,
    user_id: int | None,
) -> dict[str, Any]:
    filters = explorer.cleaned_data if explorer.is_valid() else {}
    template, server = filters.get("template"), filters.get("server")
    return {
        "records_form": form if isinstance(form, RecordPairForm) else RecordPairForm(),
        "prompts_form": form if isinstance(form, PromptPairForm) else PromptPairForm(viewer=viewer),
        "explorer": explorer,
        "requests": selectors.recent_requests(
            template_id=template.pk if template else None,
            server_id=server.pk if server else None,
            viewer=viewer,
        ),
        "comparisons": selectors.recent_comparisons(viewer=viewer, user_id=user_id),
    }
