from django import forms

from app.regressions.models import Regression


class NoteForm(forms.Form):
    """Acknowledge or mute a regression (or open it again), saying why."""

    state = forms.ChoiceField(
        choices=[(s.value, s.label) for s in Regression.State if s != Regression.State.RESOLVED]
    )
    note = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 3}))
