from django import forms

from app.prompts import git


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
