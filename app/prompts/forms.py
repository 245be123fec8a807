from typing import Any

from django import forms

from app.core.tenancy import SEES_ALL, Viewer
from app.prompts import git
from app.prompts.models import Template


class RepositoryForm(forms.Form):
    """Register a template repository: where it is, its template files, the branch, a webhook secret."""

    location = forms.CharField(
        max_length=1000,
        widget=forms.TextInput(attrs={"placeholder": "https://git.example.com/prompts.git or /srv/prompts"}),
    )
    globs = forms.CharField(
        max_length=1000,
        initial="templates/*.j2",
        help_text="Template files, comma-separated git wildmatch patterns",
    )
    branch = forms.CharField(max_length=200, required=False, help_text="Blank: the repository's HEAD")
    secret = forms.CharField(
        max_length=200,
        required=False,
        widget=forms.PasswordInput,
        help_text="Shared secret of its push webhook",
    )
    name = forms.CharField(max_length=200, required=False, help_text="Blank: the location's last part")

    def clean_location(self) -> str:
        location = str(self.cleaned_data["location"]).strip()
        problem = git.location_problem(location)
        if problem:
            raise forms.ValidationError(problem)
        return location

    def clean_globs(self) -> list[str]:
        globs = [glob.strip() for glob in str(self.cleaned_data["globs"]).split(",") if glob.strip()]
        try:
            git.path_matcher(globs)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return globs


class FamilyForm(forms.Form):
    """Name a prefix family and bind it to a template (none: unbound)."""

    name = forms.CharField(max_length=200, required=False, help_text="Blank: unnamed")
    template = forms.ModelChoiceField(
        queryset=Template.objects.order_by("name"),
        required=False,
        empty_label="Not bound",
        help_text="Requests ingested from now on carry it; requests stored before keep theirs",
    )

    def __init__(self, *args: Any, viewer: Viewer = SEES_ALL, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["template"].queryset = viewer.templates(Template.objects.order_by("name"))  # type: ignore[attr-defined]
