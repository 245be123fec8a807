from django.apps import AppConfig


class PromptsConfig(AppConfig):
    name = "app.prompts"
    label = "prompts"
