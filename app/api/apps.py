from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "app.api"
    label = "api"
