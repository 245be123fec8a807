"""The Compare page's forms: two recorded requests, or two pasted prompts."""

from typing import Any

from django import forms

from app.compare.selectors import RecordKey, previous_request_key, request_record
from app.compare.services import MAX_BLOCK_SIZE, SideInput
from app.compare.tokenization import PromptError, parse_prompt
from app.core.tenancy import SEES_ALL, Viewer
from app.fleet.models import Server
from app.prompts.models import Template


class RecordKeyField(forms.CharField):
    """A request record's key (RecordKey's text form)."""

    def to_python(self, value: Any) -> RecordKey | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        try:
            return RecordKey.parse(text)
        except ValueError:
            raise forms.ValidationError("not a recorded request") from None


NO_PREVIOUS = "there is no earlier request on its server under its cache salt and model to compare it with"


class RecordPairForm(forms.Form):
    """Two recorded requests (a cached first, b later), or one request and the earlier one it
    could best have reused from (selectors.previous_request_key)."""

    mode = forms.CharField(widget=forms.HiddenInput, initial="records")
    a = RecordKeyField(required=False)
    b = RecordKeyField(required=False)
    b_previous = RecordKeyField(required=False)

    def __init__(self, *args: Any, viewer: Viewer = SEES_ALL, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.viewer = viewer

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # Another tenant's request is no more a recorded request to this viewer than a made-up key.
        keys = [data[name] for name in ("a", "b", "b_previous") if data.get(name)]
        if any(request_record(key, viewer=self.viewer) is None for key in keys):
            raise forms.ValidationError("not a recorded request")
        if data.get("b_previous"):
            previous = previous_request_key(data["b_previous"], viewer=self.viewer)
            if previous is None:
                raise forms.ValidationError(NO_PREVIOUS)
            data["a"], data["b"] = previous, data["b_previous"]
        elif not data.get("a") or not data.get("b"):
            raise forms.ValidationError("pick a request as A (cached first) and one as B (later)")
        return data

    def comparison_args(self) -> dict[str, Any]:
        return {"a": SideInput(record=self.cleaned_data["a"]), "b": SideInput(record=self.cleaned_data["b"])}


class PromptPairForm(forms.Form):
    """Two prompts as text, chat JSON or token ids, and the server or model that would serve them.

    Browsers send a textarea's line breaks as CRLF, whatever the pasted text had: text and chat
    JSON are read with ``\n`` line breaks, as the prompt was most likely sent to vLLM (each ``\r``
    would be a token of its own). Token ids are taken as given.
    """

    FORMATS = [("auto", "Detect"), ("text", "Text"), ("chat", "Chat JSON"), ("token_ids", "Token ids")]

    mode = forms.CharField(widget=forms.HiddenInput, initial="prompts")
    a_prompt = forms.CharField(
        label="A: the cached prompt", strip=False, widget=forms.Textarea(attrs={"rows": 8})
    )
    b_prompt = forms.CharField(
        label="B: the later prompt", strip=False, widget=forms.Textarea(attrs={"rows": 8})
    )
    prompt_format = forms.ChoiceField(label="Format", choices=FORMATS, initial="auto")
    server = forms.ModelChoiceField(
        queryset=Server.objects.exclude(state=Server.State.DISABLED),
        required=False,
        empty_label="any of the model",
        to_field_name="name",
    )
    model = forms.CharField(
        required=False, max_length=255, widget=forms.TextInput(attrs={"placeholder": "without a server"})
    )
    block_size = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_BLOCK_SIZE,
        widget=forms.NumberInput(attrs={"placeholder": "the server's, else 16"}),
    )
    a_salt = forms.CharField(label="A's cache salt", required=False, max_length=1024)
    b_salt = forms.CharField(label="B's cache salt", required=False, max_length=1024)

    def __init__(self, *args: Any, viewer: Viewer = SEES_ALL, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        servers = self.fields["server"].queryset  # type: ignore[attr-defined]
        self.fields["server"].queryset = viewer.servers(servers)  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for field in ("a_prompt", "b_prompt"):
            if field in data:
                text = data[field].replace("\r\n", "\n").replace("\r", "\n")
                try:
                    data[field] = parse_prompt(text, data.get("prompt_format", "auto"))
                except PromptError as exc:
                    self.add_error(field, str(exc))
        return data

    def comparison_args(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "a": SideInput(prompt=data["a_prompt"], cache_salt=data["a_salt"] or None),
            "b": SideInput(prompt=data["b_prompt"], cache_salt=data["b_salt"] or None),
            "server": data["server"],
            "model": data["model"],
            "block_size": data["block_size"],
        }


def pair_form(data: Any, *, viewer: Viewer = SEES_ALL) -> RecordPairForm | PromptPairForm:
    """The form a POST filled in (its hidden ``mode``); recorded requests of those `viewer` sees."""
    if data.get("mode") == "records":
        return RecordPairForm(data, viewer=viewer)
    return PromptPairForm(data, viewer=viewer)


class ExplorerFilter(forms.Form):
    """Filters of the request explorer."""

    template = forms.ModelChoiceField(
        queryset=Template.objects.all(), required=False, empty_label="any template"
    )
    server = forms.ModelChoiceField(
        queryset=Server.objects.all(), required=False, empty_label="any server", to_field_name="name"
    )

    def __init__(self, *args: Any, viewer: Viewer = SEES_ALL, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["template"].queryset = viewer.templates(Template.objects.all())  # type: ignore[attr-defined]
        self.fields["server"].queryset = viewer.servers(Server.objects.all())  # type: ignore[attr-defined]
