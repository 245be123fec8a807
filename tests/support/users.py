"""Users for page and API tests."""

from typing import Any

from django.contrib.auth.models import Permission, User


def fleet_viewer(username: str, **extra: Any) -> User:
    """A user who sees every tenant (``core.view_all_tenants``, app/core/tenancy.py): the pages'
    own tests are of one fleet; tests/core/test_tenant_isolation.py is of several tenants."""
    user, _ = User.objects.get_or_create(username=username, defaults=extra)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="core", codename="view_all_tenants")
    )
    return user
