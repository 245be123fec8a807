"""The requests explorer's read: request records filtered and paged newest first by their key.

Keyset pagination on (arrived_at, server, request id), never OFFSET and never a count: a page costs
the same however deep it is. The time window always bounds the query with constants, so PostgreSQL
prunes the day partitions outside it when it plans. Its indexes (RequestRecord.Meta) are
``request_time`` for any filter (partial: each query states its condition, EXPLORER_ROWS) and
``request_template_time`` for a template.

The filters come as text (a page's query string, an API call's parameters) and are checked by one
form, so that the page and the API accept and refuse the same values.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import ExpressionWrapper, F, FloatField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.fields.tuple_lookups import Tuple, TupleLessThan

from app.core.retention import kept_token_ids_since
from app.core.tenancy import SEES_ALL, Viewer
from app.domain.keyset import Cursor, decode_cursor, encode_cursor, filters_fingerprint
from app.domain.misses import is_loss
from app.domain.retention import keeps_token_ids
from app.fleet.models import Server
from app.prompts.models import Template, TemplateVersion
from app.prompts.selectors import template_named
from app.traffic.models import EXPLORER_ROWS, LOST_COLUMNS, RequestDiagnosis, RequestRecord
from collectors import records

WINDOWS = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "6h": timedelta(hours=6),
           "24h": timedelta(days=1), "7d": timedelta(days=7)}  # fmt: skip
DEFAULT_WINDOW = "24h"
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_VERSIONS = 100  # that a commit prefix may name
# The parameters that select rows: a cursor is bound to their values (the page size and the cursor
# itself are not among them).
FILTER_NAMES = ("server", "template", "version", "tenant", "cause", "window", "until", "hit_min", "hit_max",
                "missed")  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestFilters:
    """Which request records to list: arrived in [since, until), and every filter given (None: any)."""

    since: datetime
    until: datetime
    server_id: int | None = None
    template_id: int | None = None
    version_ids: tuple[int, ...] | None = None  # the versions whose commit starts with what was asked
    tenant: str | None = None
    cause: str | None = None
    hit_min: float | None = None  # percent of prompt tokens cached, inclusive
    hit_max: float | None = None
    missed_only: bool = False  # lost reusable tokens (more than the tail below one block)
    viewer: Viewer = SEES_ALL  # whose records the viewer sees (app/core/tenancy.py)


class TemplateChoiceField(forms.ModelChoiceField):  # type: ignore[type-arg]
    """A template of the field's choices by its name (the select's values) or its id, as the API
    takes one everywhere."""

    def to_python(self, value: Any) -> Template | None:
        if value in self.empty_values:
            return None
        # NUL: no name has one, and PostgreSQL refuses it in a query (the API answers its DataError 400).
        found = None if "\x00" in str(value) else template_named(self.queryset, str(value))  # type: ignore[arg-type]
        if found is None:
            raise ValidationError(self.error_messages["invalid_choice"], code="invalid_choice")
        return found


class RequestFilterForm(forms.Form):
    """The explorer's filters as text, checked; ``filters(now=...)`` gives them resolved."""

    server = forms.ModelChoiceField(
        queryset=Server.objects.order_by("name"),
        required=False,
        to_field_name="name",
        empty_label="any server",
    )
    template = TemplateChoiceField(
        queryset=Template.objects.order_by("name"), required=False, to_field_name="name",
        empty_label="any template",
    )  # fmt: skip
    version = forms.RegexField(
        regex=r"^[0-9a-fA-F]{4,40}$", required=False, label="Version (commit)",
        error_messages={"invalid": "a commit sha, or its first 4 or more hex digits"},
        widget=forms.TextInput(attrs={"placeholder": "commit sha", "size": 10}),
    )  # fmt: skip
    tenant = forms.CharField(
        max_length=records.TENANT_MAX, required=False, widget=forms.TextInput(attrs={"size": 12})
    )
    cause = forms.ChoiceField(choices=[("", "any cause"), *RequestDiagnosis.Cause.choices], required=False)
    window = forms.ChoiceField(
        choices=[(name, f"last {name}") for name in WINDOWS], required=False, label="Time window"
    )
    until = forms.DateTimeField(
        required=False, label="Until (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": 1}, format="%Y-%m-%dT%H:%M:%S"),
    )  # fmt: skip
    hit_min = forms.FloatField(
        min_value=0, max_value=100, required=False, label="Hit % from",
        widget=forms.NumberInput(attrs={"size": 4, "step": "any"}),
    )  # fmt: skip
    hit_max = forms.FloatField(
        min_value=0, max_value=100, required=False, label="to",
        widget=forms.NumberInput(attrs={"size": 4, "step": "any"}),
    )  # fmt: skip
    missed = forms.BooleanField(required=False, label="Missed only")
    cursor = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)

    def __init__(
        self, data: Mapping[str, Any] | None = None, *, viewer: Viewer = SEES_ALL, **kwargs: Any
    ) -> None:
        # The default window is a value of the query like any other: the form shows it chosen.
        given = {name: data.get(name) for name in data} if data is not None else {}
        super().__init__({"window": DEFAULT_WINDOW} | given, label_suffix="", **kwargs)
        # The choices, and the names a filter accepts, are the viewer's: another tenant's server is
        # no more a valid choice than a server that does not exist.
        self.viewer = viewer
        self.fields["server"].queryset = viewer.servers(Server.objects.order_by("name"))  # type: ignore[attr-defined]
        self.fields["template"].queryset = viewer.templates(Template.objects.order_by("name"))  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        low, high = data.get("hit_min"), data.get("hit_max")
        if low is not None and high is not None and low > high:
            self.add_error("hit_max", "the upper bound of the hit % is below its lower bound")
        if data.get("version"):
            templates = self.viewer.templates(Template.objects.all())
            found = TemplateVersion.objects.filter(
                commit_sha__istartswith=data["version"], template__in=templates
            )
            if data.get("template"):
                found = found.filter(template=data["template"])
            data["version_ids"] = tuple(found.values_list("pk", flat=True)[: MAX_VERSIONS + 1])
            if not data["version_ids"]:
                self.add_error("version", "no template version has a commit starting with this")
            elif len(data["version_ids"]) > MAX_VERSIONS:
                self.add_error("version", "too many versions start with this: give more of the commit sha")
        return data

    def filters(self, *, now: datetime) -> RequestFilters:
        """The checked filters; a window without `until` ends `now`. Call after is_valid()."""
        data = self.cleaned_data
        until = data.get("until") or now
        since = until - WINDOWS[data.get("window") or DEFAULT_WINDOW]
        return RequestFilters(
            since=since, until=until,
            server_id=data["server"].pk if data.get("server") else None,
            template_id=data["template"].pk if data.get("template") else None,
            version_ids=data.get("version_ids") or None, tenant=data.get("tenant") or None,
            cause=data.get("cause") or None, hit_min=data.get("hit_min"), hit_max=data.get("hit_max"),
            missed_only=bool(data.get("missed")), viewer=self.viewer,
        )  # fmt: skip

    def pinned(self, filters: RequestFilters) -> dict[str, str]:
        """The filters as query parameters with `until` pinned, so that following pages (and a shared
        link) read the same window however much later they are opened."""
        params = {name: str(self.data.get(name, "")).strip() for name in FILTER_NAMES}
        params["until"] = filters.until.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        params["window"] = params["window"] or DEFAULT_WINDOW
        params["missed"] = "on" if self.cleaned_data.get("missed") else ""
        return {name: value for name, value in params.items() if value}

    def after(self, filters: RequestFilters) -> Cursor | None:
        """The cursor given, if any. Raises BadCursor for one not written under these filters."""
        token = self.cleaned_data.get("cursor")
        return decode_cursor(token, fingerprint=fingerprint(self, filters)) if token else None


def fingerprint(form: RequestFilterForm, filters: RequestFilters) -> str:
    return filters_fingerprint(form.pinned(filters))


@dataclass(frozen=True, slots=True)
class ExploredRequest:
    record: RequestRecord
    diagnosis: RequestDiagnosis | None  # None until diagnosed

    @property
    def hit_percent(self) -> float | None:
        prompt, cached = self.record.prompt_tokens, self.record.cached_tokens
        return None if not prompt or cached is None else 100 * cached / prompt


@dataclass(frozen=True, slots=True)
class RequestPage:
    rows: list[ExploredRequest]
    next: Cursor | None  # the last row's key when more rows follow


def explore_requests(filters: RequestFilters, *, after: Cursor | None, limit: int = PAGE_SIZE) -> RequestPage:
    """One page of the records matching `filters`, newest first (ties by server then request id,
    both descending), strictly after `after`; with their diagnoses. Token ids and hashes unread."""
    found = list(matching_requests(filters, after=after)[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    diagnoses = _diagnoses(found)
    rows = [ExploredRequest(r, diagnoses.get((r.server_id, r.request_id, r.arrived_at))) for r in found]
    last = found[-1] if more else None
    return RequestPage(
        rows, None if last is None else Cursor(last.arrived_at, last.server_id, last.request_id)
    )


def encoded(cursor: Cursor | None, form: RequestFilterForm, filters: RequestFilters) -> str | None:
    """The cursor as the token the next page's link carries."""
    return None if cursor is None else encode_cursor(cursor, fingerprint=fingerprint(form, filters))


_SHOWN = ("server_id", "request_id", "arrived_at", "tenant", "prompt_tokens", "cached_tokens",
          "client_ttft_seconds", "server_ttft_seconds", "server__name", "template__name",
          "template_version__commit_sha")  # fmt: skip


def matching_requests(filters: RequestFilters, *, after: Cursor | None) -> QuerySet[RequestRecord]:
    # Constants on arrived_at: the planner prunes the partitions outside the window.
    records = filters.viewer.traffic(RequestRecord.objects.all()).filter(
        EXPLORER_ROWS, arrived_at__gte=filters.since, arrived_at__lt=filters.until
    )
    if after is not None:
        # A row comparison, (arrived_at, server_id, request_id) < (...): an index condition on
        # request_time, estimated as a range (an OR of three was not, and got a sort). Django builds it
        # for composite primary keys; this key's order is not the primary key's, hence the lookup.
        key = Tuple(F("arrived_at"), F("server_id"), F("request_id"))
        records = records.filter(arrived_at__lte=after.arrived_at).filter(
            TupleLessThan(key, (after.arrived_at, after.server_id, after.request_id))
        )
    exact = {"server_id": filters.server_id, "template_id": filters.template_id, "tenant": filters.tenant}
    records = records.filter(**{name: value for name, value in exact.items() if value is not None})
    if filters.version_ids is not None:
        records = records.filter(template_version_id__in=filters.version_ids)
    records = _hit_range(records, low=filters.hit_min, high=filters.hit_max)
    if filters.cause is not None or filters.missed_only:
        # A scalar subquery, not EXISTS: PostgreSQL turns an EXISTS into a semi-join, estimates the
        # join on the three-column key at one row, and then sorts the whole window's matches (2 s
        # over a week of a million records, bench/bench_pages.py). A scalar subquery stays a probe of
        # the diagnosis's primary key per record, read in the page's order until the page is full.
        matched = Subquery(_diagnosis_of_row(filters).values(one=Value(1))[:1])
        records = records.alias(diagnosis_matches=matched).filter(diagnosis_matches__isnull=False)
    return (
        records.select_related("server", "template", "template_version")
        .only(*_SHOWN)
        .order_by("-arrived_at", "-server_id", "-request_id")
    )


def _hit_range(
    records: QuerySet[RequestRecord], *, low: float | None, high: float | None
) -> QuerySet[RequestRecord]:
    if low is None and high is None:
        return records
    records = records.filter(prompt_tokens__gt=0, cached_tokens__isnull=False)
    for bound, lookup in ((low, "gte"), (high, "lte")):
        if bound is not None:
            share = ExpressionWrapper(F("prompt_tokens") * Value(bound / 100), output_field=FloatField())
            records = records.filter(**{f"cached_tokens__{lookup}": share})
    return records


def _diagnosis_of_row(filters: RequestFilters) -> QuerySet[RequestDiagnosis]:
    """The diagnosis of the outer record, when it has the cause (or lost reusable tokens) asked for."""
    diagnoses = RequestDiagnosis.objects.filter(
        server_id=OuterRef("server_id"), request_id=OuterRef("request_id"), arrived_at=OuterRef("arrived_at"),
        arrived_at__gte=filters.since, arrived_at__lt=filters.until,
    )  # fmt: skip
    if filters.cause is not None:
        diagnoses = diagnoses.filter(cause=filters.cause)
    if filters.missed_only:
        reusable = [column for cause, column in LOST_COLUMNS.items() if is_loss(cause)]
        diagnoses = diagnoses.filter(_any_lost(reusable))
    return diagnoses


def _any_lost(columns: list[str]) -> Q:
    found = Q()
    for column in columns:
        found |= Q(**{f"{column}__gt": 0})
    return found


def _diagnoses(found: list[RequestRecord]) -> dict[tuple[int, str, datetime], RequestDiagnosis]:
    if not found:
        return {}
    keys = [(r.server_id, r.request_id, r.arrived_at) for r in found]
    diagnoses = RequestDiagnosis.objects.filter(
        pk__in=keys,
        arrived_at__gte=min(r.arrived_at for r in found),
        arrived_at__lte=max(r.arrived_at for r in found),
    ).only(
        "server_id",
        "request_id",
        "arrived_at",
        "cause",
        "unknown",
        "diverged_at",
        "losses",
        "changed_part",
        "part_detail",
    )
    return {(d.server_id, d.request_id, d.arrived_at): d for d in diagnoses}


def kept_token_ids(record: RequestRecord, *, now: datetime) -> list[int] | None:
    """A record's prompt token ids while retention keeps them, else None. Prompt text: call it only
    for a viewer who may read prompts (app.prompts.killers.may_read_prompts), and never log it."""
    if not keeps_token_ids(record.arrived_at, kept_token_ids_since(now)):
        return None
    found = RequestRecord.objects.filter(
        server_id=record.server_id, request_id=record.request_id, arrived_at=record.arrived_at
    )
    return found.values_list("token_ids", flat=True).first()
