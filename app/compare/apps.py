from django.apps import AppConfig


class CompareConfig(AppConfig):
    name = "app.compare"
    label = "compare"
