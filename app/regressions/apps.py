from django.apps import AppConfig


class RegressionsConfig(AppConfig):
    name = "app.regressions"
    label = "regressions"
