from django.contrib import admin

from app.regressions.models import Regression


@admin.register(Regression)
class RegressionAdmin(admin.ModelAdmin[Regression]):
    list_display = [
        "scope",
        "template",
        "server",
        "tenant",
        "metric",
        "kind",
        "changed_at",
        "rate_before",
        "rate_after",
        "state",
        "resolution",
    ]
    list_filter = ["scope", "metric", "kind", "state", "resolution"]
