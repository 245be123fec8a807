from django.apps import AppConfig
from django.core import checks


class CompareConfig(AppConfig):
    name = "app.compare"
    label = "compare"

    def ready(self) -> None:
        from app.compare.checks import tokenizer_file_loads

        checks.register(tokenizer_file_loads)
