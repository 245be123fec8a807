from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "app.dashboard"
    label = "dashboard"
