from django.contrib import admin

from app.fleet.models import Server


@admin.register(Server)
class ServerAdmin(admin.ModelAdmin[Server]):
    list_display = ["name", "state", "model", "block_size", "hash_algo", "tenant", "last_scraped_at"]
    list_filter = ["state", "model", "tenant"]
    search_fields = ["name", "base_url", "model"]
    readonly_fields = [
        "block_size", "hash_algo", "discovered_at", "base_models", "lora_adapters", "models_read_at",
        "last_scraped_at", "created_at",
    ]  # fmt: skip
