from typing import Any
from urllib.parse import urlsplit

from django import forms

from app.fleet.models import Server


class ProposedServerForm(forms.Form):
    """A person's decision on a proposed server: accept it (at its base URL), or merge it into the
    registered server it stands for. The submit button pressed names the action."""

    action = forms.ChoiceField(choices=[("accept", "Accept"), ("merge", "Merge")])
    # Not a URLField: Django's URL validator wants a dotted domain, and servers are often plain host
    # names (http://vllm:8000 in docker-compose).
    base_url = forms.CharField(
        required=False, max_length=200, widget=forms.URLInput(attrs={"placeholder": "http://vllm-0:8000"})
    )
    into = forms.ModelChoiceField(
        queryset=Server.objects.exclude(state=Server.State.PROPOSED),
        required=False,
        empty_label="merge into…",
    )

    def clean_base_url(self) -> str:
        url = str(self.cleaned_data["base_url"])
        parts = urlsplit(url)
        try:
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:  # a port that is not a number
            valid = False
        if url and not valid:
            raise forms.ValidationError(
                "Enter an http:// or https:// URL with a host, e.g. http://vllm-0:8000."
            )
        return url

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("action") == "accept" and not data.get("base_url") and "base_url" not in self.errors:
            self.add_error("base_url", "Accepting needs the server's base URL, where its /metrics is pulled.")
        if data.get("action") == "merge" and not data.get("into"):
            self.add_error("into", "Choose the registered server to merge into.")
        return data
