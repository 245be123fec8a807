from django.contrib import admin

from app.core.models import Membership


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ["user", "tenant", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["user__username", "tenant"]
    autocomplete_fields = ["user"]
