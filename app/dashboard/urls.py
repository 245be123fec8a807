from django.urls import path

from app.dashboard.pages import collection, explorer, fleet, request, server, templates, tenants

app_name = "dashboard"
urlpatterns = [
    path("", fleet.home, name="home"),
    path("proposed/<int:server_id>/", fleet.proposed_server, name="proposed-server"),
    path("collection/", collection.collection, name="collection"),
    path("tenants/", tenants.tenants, name="tenants"),
    path("servers/<str:server>/", server.server_detail, name="server-detail"),
    path("requests/", explorer.requests_explorer, name="requests"),
    path("requests/<str:server>/<path:request_id>/", request.request_detail, name="request-detail"),
    # Below /templates/ (the repositories, app.prompts.urls): a template's page shows prompt text, which
    # only the layers above traffic and compare may read.
    path("templates/", templates.template_list, name="templates"),
    path("templates/<int:template_id>/", templates.template_detail, name="template-detail"),
]
