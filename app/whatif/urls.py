from django.urls import path

from app.whatif import views

app_name = "whatif"
urlpatterns = [
    path("", views.whatif, name="page"),
]
