from django.apps import AppConfig


class DiagnosisConfig(AppConfig):
    """Why each request missed: the replay of the fleet's KV events against its records, and the
    reads of its answers. The rows it writes (RequestDiagnosis) are traffic's, keyed as the records."""

    name = "app.diagnosis"
    label = "diagnosis"
