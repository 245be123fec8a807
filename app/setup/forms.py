from collections.abc import Callable
from typing import Any

from django import forms

from app.fleet.endpoints import http_url_problem, zmq_endpoint_problem
from app.prompts.forms import RepositoryForm


class EndpointsForm(forms.Form):
    """A registered server's endpoints, model, tenant, group and pull interval (its name never changes)."""

    # Not URLFields: Django's URL validator wants a dotted domain, and servers are often plain host
    # names (http://vllm:8000 in docker-compose).
    base_url = forms.CharField(
        max_length=200, label="Base URL", help_text="OpenAI-compatible API root, e.g. http://vllm-0:8000"
    )
    metrics_url = forms.CharField(
        max_length=200, required=False, label="Metrics URL", help_text="Blank: <base URL>/metrics"
    )
    kv_events_endpoint = forms.CharField(
        max_length=255,
        required=False,
        label="KV events",
        help_text="ZMQ PUB, e.g. tcp://vllm-0:5557; blank: none",
    )
    kv_replay_endpoint = forms.CharField(
        max_length=255, required=False, label="KV replay", help_text="ZMQ ROUTER, e.g. tcp://vllm-0:5558"
    )
    kv_topic = forms.CharField(max_length=255, required=False, label="KV topic")
    model = forms.CharField(max_length=255, required=False, help_text="Blank: read from its /metrics")
    tenant = forms.CharField(
        max_length=100, required=False, help_text="Tenant whose users may see it; blank: all"
    )
    group = forms.SlugField(
        max_length=100,
        initial="platform",
        help_text="The team that runs it: its capacity, restart and KV-stream alerts are routed to it",
    )
    scrape_interval_seconds = forms.IntegerField(
        min_value=1, max_value=3600, initial=15, label="Pull every (seconds)"
    )

    def clean_base_url(self) -> str:
        return _checked(self.cleaned_data["base_url"], http_url_problem)

    def clean_metrics_url(self) -> str:
        return _checked(self.cleaned_data["metrics_url"], http_url_problem)

    def clean_kv_events_endpoint(self) -> str:
        return _checked(self.cleaned_data["kv_events_endpoint"], zmq_endpoint_problem)

    def clean_kv_replay_endpoint(self) -> str:
        return _checked(self.cleaned_data["kv_replay_endpoint"], zmq_endpoint_problem)


class ServerForm(EndpointsForm):
    """Register a server: its name (the one request records name it by) and its endpoints."""

    name = forms.SlugField(max_length=100, help_text="Letters, digits, - and _; request records name it so")
    field_order = ["name"]


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)


def _checked(value: str, problem_of: Callable[[str], str | None]) -> str:
    value = value.strip()
    problem = problem_of(value) if value else None
    if problem:
        raise forms.ValidationError(problem)
    return value


class RepositoryEditForm(RepositoryForm):
    """A registered repository's location, globs and branch; its webhook secret changes only when one
    is typed (blank keeps it). Its name stays."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["name"]
        self.fields["secret"].help_text = "Blank: keep the current one"
