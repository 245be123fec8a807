from django.apps import AppConfig


class RollupsConfig(AppConfig):
    """The sum tables' machinery: declared once (catalog), refreshed from the raw rows and the
    diagnoses, read per window and per viewer. The tables themselves are traffic's."""

    name = "app.rollups"
    label = "rollups"
