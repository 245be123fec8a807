from django.urls import path

from app.setup import views

app_name = "setup"
urlpatterns = [
    path("servers/", views.servers, name="servers"),
    path("servers/<int:server_id>/", views.server, name="server"),
    path("servers/<int:server_id>/enabled/", views.server_enabled, name="server-enabled"),
    path("servers/<int:server_id>/proposed/", views.proposed, name="proposed"),
    path("ingest-tokens/", views.ingest_tokens, name="ingest-tokens"),
    path("ingest-tokens/<int:token_id>/revoke/", views.revoke_ingest_token, name="revoke-ingest-token"),
    path("repositories/<int:repository_id>/", views.repository, name="repository"),
    path("tokens/", views.personal_tokens, name="personal-tokens"),
    path("tokens/<int:token_id>/revoke/", views.revoke_personal_token, name="revoke-personal-token"),
]
