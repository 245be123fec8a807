from datetime import datetime
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from app.compare.killers import Samples, samples_in_order, visible_killers
from app.core.tenancy import Viewer, viewer_of
from app.domain.cost import COUNTS
from app.domain.misses import cause_label
from app.fleet.models import Server
from app.prompts.killers import SampleKey, may_read_prompts
from app.regressions import evidence, page, selectors, services, webhook
from app.regressions.cost import cost_window_of
from app.regressions.evidence import FrozenKiller
from app.regressions.forms import NoteForm
from app.regressions.models import Regression
from app.rollups.series import as_csv

PAGE_SIZE = 50


@login_required
def regression_list(request: HttpRequest) -> HttpResponse:
    """Regressions, active ones by default (?state=all, resolved, ...), newest change first."""
    state = request.GET.get("state", "active")
    if state not in selectors.STATES:
        state = "active"
    found = selectors.regressions(state=state, viewer=viewer_of(request.user))
    page = Paginator(found, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"page": page, "state": state, "states": selectors.STATES}
    return render(request, "regressions/list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def regression_detail(request: HttpRequest, regression_id: int) -> HttpResponse:
    """One regression: its figures, what it is attributed to and why, its cost; a note from a person."""
    viewer = viewer_of(request.user)
    regression = get_object_or_404(selectors.regressions(state="all", viewer=viewer), pk=regression_id)
    window, minutes = page.chart_window(regression, now=timezone.now())
    found = page.capacity(regression, window)
    charts = [page.hit_rate_chart(regression, window, minutes), *([found.chart] if found else [])]
    if request.method == "GET" and request.GET.get("format") == "csv":
        return _chart_csv(regression, charts, request.GET.get("chart", ""))
    initial = {
        "state": regression.state if regression.is_active else Regression.State.OPEN,
        "note": regression.note,
    }
    form = NoteForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        services.note_regression(
            regression, state=form.cleaned_data["state"], note=form.cleaned_data["note"], user=request.user,
            now=timezone.now(),
        )  # fmt: skip
        messages.success(request, f"Regression {regression.pk}: {regression.get_state_display().lower()}.")
        return redirect("regressions:detail", regression_id=regression.pk)
    context = {
        "regression": regression,
        "form": form,
        "pair": regression.evidence.get("pair", {}),
        "killers": _killer_rows(regression, readable=may_read_prompts(request.user), viewer=viewer),
        "killer_every": settings.PREFIXSCOPE_KILLER_EVERY_SECONDS,
        "diff": evidence.diff_rows(regression.suspect_version.diff) if regression.suspect_version else [],
        "notices": _notices(regression),
        "resolution_text": _RESOLUTIONS.get(regression.resolution, regression.get_resolution_display()),
        "ttft_ratio": _ratio(regression),
        "charts": charts,
        "capacity": found,
        "prediction": page.prediction(regression),
        "query": "",  # the CSV links' (the page's window is the regression's)
        **_shift(regression),
        **_cost_window(regression),
    }
    return render(request, "regressions/detail.html", context)


def _cost_window(regression: Regression) -> dict[str, object]:
    """The window its cost was priced over and what it counts; for a template's, its page over the
    same window (which shows the same figure)."""
    since, until = cost_window_of(regression)
    link = ""
    if regression.scope == Regression.Scope.TEMPLATE and regression.template_id is not None:
        query = urlencode({"window": "custom", "since": since.isoformat(), "until": until.isoformat()})
        link = reverse("dashboard:template-detail", args=[regression.template_id]) + f"?{query}"
    counts = COUNTS[regression.template_id is not None]
    return {"cost_since": since, "cost_until": until, "cost_counts": counts, "cost_page": link}


def _chart_csv(regression: Regression, charts: list[page.RegressionChart], slug: str) -> HttpResponse:
    chart = next((c for c in charts if c.slug == slug), None)
    if chart is None:
        raise Http404("no such chart")
    response = HttpResponse(as_csv(chart.times, chart.series), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="regression-{regression.pk}-{slug}.csv"'
    return response


_RESOLUTIONS: dict[str, str] = {
    Regression.Resolution.RECOVERED: "it recovered",
    Regression.Resolution.REVERTED: "its suspect commit was reverted and the revert took the traffic",
    Regression.Resolution.IDLE: "its scope sent no traffic for the whole detection window",
}


def _ratio(regression: Regression) -> float | None:
    before, after = regression.ttft_before_seconds, regression.ttft_after_seconds
    return after / before if before and after is not None else None


def _shift(regression: Regression) -> dict[str, object]:
    """The cause shift as rows: each cause's share of the prompt tokens before, in the first minutes
    after (what names the kind) and since the change (the whole segment: whether it lasted; None
    for a regression opened before it was kept)."""
    shift = regression.cause_shift
    before, after, since = shift.get("before", {}), shift.get("after", {}), shift.get("since")
    causes = set(before) | set(after) | set(since or {})
    ordered = sorted(causes, key=lambda cause: -(after.get(cause, 0) - before.get(cause, 0)))
    rows = [
        (
            cause_label(cause),
            before.get(cause, 0.0),
            after.get(cause, 0.0),
            None if since is None else since.get(cause, 0.0),
        )
        for cause in ordered
    ]
    return {
        "shift_rows": rows,
        "shift_since": since is not None,
        "routing": regression.evidence.get("routing"),
    }


def _killer_rows(
    regression: Regression, *, readable: bool, viewer: Viewer
) -> list[tuple[FrozenKiller, Samples | None, list[tuple[str, str]]]]:
    """The frozen killers, each with its samples' text for a viewer who may read prompts (else
    None) and links to the sample requests the viewer sees, as on the template's page."""
    frozen = evidence.frozen_killers(regression)
    killers = [f.killer for f in frozen]
    texts: list[Samples | None] = [None] * len(frozen)
    if readable and frozen:
        texts = list(samples_in_order(killers, now=timezone.now(), viewer=viewer))
    _, seen = visible_killers(killers, viewer=viewer)
    names = dict(viewer.servers(Server.objects.all()).values_list("pk", "name"))
    links = [
        [(key.request_id, reverse("dashboard:request-detail", args=[names[key.server_id], key.request_id]))
         for stored in killer.samples
         if (key := SampleKey.of(stored)) in seen and key.server_id in names]
        for killer in killers
    ]  # fmt: skip
    return list(zip(frozen, texts, links, strict=True))


def _notices(regression: Regression) -> list[tuple[str, dict[str, object] | None]]:
    """The webhook's last outcome for each event (None: not sent); none when no webhook is set."""
    if not settings.PREFIXSCOPE_REGRESSION_WEBHOOK_URL:
        return []
    kept = regression.evidence.get("webhook", {})
    events = [event for event in webhook.EVENTS if event == "opened" or not regression.is_active]
    return [(event, _shown(kept[event]) if event in kept else None) for event in events]


def _shown(outcome: dict[str, object]) -> dict[str, object]:
    return outcome | {"at": datetime.fromisoformat(str(outcome["at"]))}
