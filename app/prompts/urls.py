from django.urls import path

from app.prompts import views

app_name = "prompts"
urlpatterns = [
    path("repositories/", views.repositories, name="repositories"),
    path("repositories/<int:repository_id>/import/", views.import_now, name="import-now"),
    path("families/", views.families, name="families"),
    path("families/<int:family_id>/", views.family, name="family"),
]
