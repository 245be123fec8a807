from django.urls import path

from app.compare import views

app_name = "compare"
urlpatterns = [
    path("", views.start, name="start"),
    path("<slug:slug>/", views.detail, name="detail"),
]
