from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "app.traffic"
    label = "traffic"
