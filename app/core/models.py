from django.conf import settings
from django.db import models


class Membership(models.Model):
    """A user belongs to a tenant: they see its servers, templates, requests and regressions.

    Tenants are the plain names the traffic carries (a request's tenant, a server's or a template's
    owner), not rows of their own: a membership names one. Who sees what is decided in
    app/core/tenancy.py, and nowhere else.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.CharField(max_length=100, help_text="The tenant's name, as its traffic carries it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "tenant"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_identity"),
            models.CheckConstraint(condition=~models.Q(tenant=""), name="membership_tenant_named"),
        ]
        permissions = [("view_all_tenants", "Sees every tenant's servers, traffic and regressions")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}"
