"""The What-if page's scope and window, as its URL asks for them, and the question that answers them:
the latest of that exact scope, window and tenants (its answers read again), else one queued."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.utils import timezone

from app.core.tenancy import Viewer
from app.whatif.models import WhatIfQuestion
from app.whatif.questions import answers_of, queue, settled
from app.whatif.services import MAX_WINDOW, Scope, ScopeKind, window_problem

DEFAULT_MINUTES = 10


class AskError(ValueError):
    """The URL asks for no scope or window the page can answer (the message says why)."""


@dataclass(frozen=True, slots=True)
class Asking:
    """A scope and a window of whole seconds, as the page's URL states them."""

    scope: Scope
    since: datetime
    until: datetime

    @property
    def query(self) -> str:
        """The URL's query: the scope, its name, and the window in UTC (ISO 8601)."""
        params = {"scope": self.scope.kind.value}
        if self.scope.name:
            params["name"] = self.scope.name
        params |= {"since": _iso(self.since), "until": _iso(self.until)}
        return urlencode(params, safe=":")

    @property
    def minutes(self) -> float:
        return (self.until - self.since).total_seconds() / 60


def asked(params: Mapping[str, str], *, now: datetime) -> tuple[Asking, bool]:
    """The scope and window `params` ask for, and whether the URL already states them as `query`
    does (else the page redirects there, so that a reload, a poll or a link reads the same question).
    `minutes` (the last so many whole minutes before `now`) or `since` and `until`; the last
    DEFAULT_MINUTES when neither. Raises AskError on anything else."""
    scope = _scope(params)
    if "since" in params or "until" in params:
        since, until = _moment(params, "since"), _moment(params, "until")
        stated = "minutes" not in params
    else:
        minutes = _minutes(params.get("minutes", str(DEFAULT_MINUTES)))
        until = now.astimezone(UTC).replace(second=0, microsecond=0)
        since, stated = until - timedelta(minutes=minutes), False
    problem = window_problem(since, until)
    if problem is not None:
        raise AskError(problem)
    found = Asking(scope, since, until)
    return found, stated and params.get("since") == _iso(since) and params.get("until") == _iso(until)


def question_for(asking: Asking, *, viewer: Viewer, asked_by_id: int | None) -> WhatIfQuestion:
    """The latest answered question of this scope, window and viewer's tenants; else the latest
    asked (running, queued, or failed with its reason); else a new one, queued."""
    mine = _questions(asking, viewer)
    done = mine.filter(state=WhatIfQuestion.State.DONE).order_by("-finished_at").first()
    if done is not None and answers_of(done) is None:  # kept by an older version: asked anew, once
        newer = mine.filter(asked_at__gt=done.asked_at).order_by("-asked_at").first()
        return newer or ask_again(asking, viewer=viewer, asked_by_id=asked_by_id)
    latest = mine.order_by("-asked_at").first()
    return (
        done
        or (latest and settled(latest, now=timezone.now()))
        or ask_again(asking, viewer=viewer, asked_by_id=asked_by_id)
    )


def ask_again(asking: Asking, *, viewer: Viewer, asked_by_id: int | None) -> WhatIfQuestion:
    """A new question of the scope and window, queued (a failed one's reason may have gone), as it
    is once queued (outside a transaction the queueing is done: a broker away has failed it)."""
    question = queue(
        scope=asking.scope, since=asking.since, until=asking.until, viewer=viewer, asked_by_id=asked_by_id
    )
    question.refresh_from_db()
    return question


def _questions(asking: Asking, viewer: Viewer):  # type: ignore[no-untyped-def]
    # The tenants are part of the question: another viewer's answers count other requests.
    found = WhatIfQuestion.objects.filter(
        scope=asking.scope.kind.value, name=asking.scope.name, since=asking.since, until=asking.until
    )
    if viewer.tenants is None:
        return found.filter(tenants__isnull=True)
    return found.filter(tenants=sorted(viewer.tenants))


def _scope(params: Mapping[str, str]) -> Scope:
    kind, name = params.get("scope", "fleet"), params.get("name", "").strip()
    if kind not in ScopeKind.__members__.values():
        raise AskError(f"scope is one of {', '.join(ScopeKind)}, not {kind[:40]!r}")
    if kind == ScopeKind.FLEET:
        return Scope(ScopeKind.FLEET)
    if not name or len(name) > 200:
        raise AskError(f"a {kind} scope needs its name (name=...)")
    return Scope(ScopeKind(kind), name)


def _minutes(value: str) -> int:
    try:
        minutes = int(value)
    except ValueError:
        raise AskError(f"minutes is a whole number, not {value[:20]!r}") from None
    if not 1 <= minutes <= MAX_WINDOW.total_seconds() / 60:
        raise AskError(f"minutes from 1 to {int(MAX_WINDOW.total_seconds() // 60)}, please")
    return minutes


def _moment(params: Mapping[str, str], name: str) -> datetime:
    """A time of the URL: ISO 8601, UTC unless it says otherwise, to the second."""
    value = params.get(name, "")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise AskError(f"{name} is a time such as 2026-01-31T09:30:00Z, not {value[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).replace(microsecond=0)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
