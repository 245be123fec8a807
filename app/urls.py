from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from app.api.api import api
from app.api.ingest import otlp
from app.core import views as core_views
from app.dashboard.metrics import views as metrics_views

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("metrics", metrics_views.metrics, name="metrics"),
    path("favicon.ico", core_views.favicon, name="favicon"),
    path("docs/runbooks/", core_views.runbooks, name="runbooks"),
    path("docs/runbooks/<slug:alert>/", core_views.runbook, name="runbook"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("v1/traces", otlp.traces, name="otlp-traces"),
    path("compare/", include("app.compare.urls")),
    # The Templates list is the dashboard's /templates/; repositories and families below it are prompts'.
    path("templates/", include("app.prompts.urls")),
    path("regressions/", include("app.regressions.urls")),
    path("setup/", include("app.setup.urls")),
    path("whatif/", include("app.whatif.urls")),
    path("", include("app.dashboard.urls")),
]
