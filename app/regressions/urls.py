from django.urls import path

from app.regressions import views

app_name = "regressions"
urlpatterns = [
    path("", views.regression_list, name="list"),
    path("<int:regression_id>/", views.regression_detail, name="detail"),
]
