from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from app.api import otlp
from app.api.api import api
from app.core import views as core_views

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("metrics", core_views.metrics, name="metrics"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("v1/traces", otlp.traces, name="otlp-traces"),
    path("compare/", include("app.compare.urls")),
    path("", include("app.dashboard.urls")),
]
