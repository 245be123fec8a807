from django.contrib import admin

from app.regressions.models import Regression


@admin.register(Regression)
class RegressionAdmin(admin.ModelAdmin[Regression]):
    list_display = ["metric", "template", "server", "changed_at", "before_value", "after_value", "state"]
    list_filter = ["metric", "state"]
