from django.urls import path

from app.dashboard import explorer, server_page, template_page, views

app_name = "dashboard"
urlpatterns = [
    path("", views.home, name="home"),
    path("collection/", views.collection, name="collection"),
    path("tenants/", views.tenants, name="tenants"),
    path("servers/<str:server>/", server_page.server_detail, name="server-detail"),
    path("proposed/<int:server_id>/", views.proposed_server, name="proposed-server"),
    path("requests/", explorer.requests_explorer, name="requests"),
    path("requests/<str:server>/<path:request_id>/", views.request_detail, name="request-detail"),
    # Below /templates/ (the repositories, app.prompts.urls): a template's page shows prompt text, which
    # only the layers above traffic and compare may read.
    path("templates/", template_page.template_list, name="templates"),
    path("templates/<int:template_id>/", template_page.template_detail, name="template-detail"),
]
