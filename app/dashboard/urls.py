from django.urls import path

from app.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.home, name="home"),
    path("collection/", views.collection, name="collection"),
    path("tenants/", views.tenants, name="tenants"),
    path("proposed/<int:server_id>/", views.proposed_server, name="proposed-server"),
    path("requests/<str:server>/<path:request_id>/", views.request_detail, name="request-detail"),
]
