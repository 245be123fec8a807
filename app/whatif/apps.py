from django.apps import AppConfig


class WhatIfConfig(AppConfig):
    """What another fleet configuration would reuse: a window of records replayed through the
    domain's model of vLLM's prefix cache (app/domain/replay), calibrated on what the engines
    reported, asked from the What-if page, the API and `manage.py whatif`."""

    name = "app.whatif"
    label = "whatif"
