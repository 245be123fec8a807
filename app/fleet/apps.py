from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "app.fleet"
    label = "fleet"
