from django.urls import path

from posttrain.core.api import views

urlpatterns = [
    path("health/", views.health, name="api-health"),
]
