from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_http_methods

from app.core.http import HtmxHttpRequest
from app.core.tenancy import viewer_of
from app.whatif import page
from app.whatif.models import WhatIfQuestion
from app.whatif.questions import answers_of
from app.whatif.services import scope_visible
from app.whatif.shown import as_csv, shown

PAGE = "whatif/whatif.html"


@login_required
@require_http_methods(["GET", "POST"])
def whatif(request: HtmxHttpRequest) -> HttpResponse:
    """What-if of a scope over the window in the URL: the latest answers of that question, or its
    progress (htmx polls #whatif-answer) once queued; a POST asks it again. `format=csv&table=...`:
    the capacity or routing table."""
    viewer = viewer_of(request.user)
    try:
        asking, stated = page.asked(request.GET, now=timezone.now())
    except page.AskError as exc:
        return render(request, PAGE, {"problem": str(exc)}, status=400)
    if not scope_visible(asking.scope, viewer):
        raise Http404("no such scope")
    here = f"{reverse('whatif:page')}?{asking.query}"
    if not stated:
        return redirect(here)
    if request.method == "POST":
        page.ask_again(asking, viewer=viewer, asked_by_id=request.user.pk)
        return redirect(here)
    question = page.question_for(asking, viewer=viewer, asked_by_id=request.user.pk)
    if request.GET.get("format") == "csv":
        return _csv(question, request.GET.get("table", ""))
    answers = answers_of(question)
    context = {"asking": asking, "question": question, "here": here, "shown": answers and shown(answers)}
    return render(request, PAGE + ("#whatif-answer" if request.htmx else ""), context)


def _csv(question: WhatIfQuestion, table: str) -> HttpResponse:
    answers = answers_of(question)
    found = None if answers is None else as_csv(answers, table)
    if found is None:
        raise Http404("no such table, or not answered yet")
    response = HttpResponse(found, content_type="text/csv; charset=utf-8")
    name = "-".join(filter(None, ("whatif", question.scope, slugify(question.name), table))) + ".csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
