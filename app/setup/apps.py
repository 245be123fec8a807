from django.apps import AppConfig


class SetupConfig(AppConfig):
    name = "app.setup"
    label = "setup"
