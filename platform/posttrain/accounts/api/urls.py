from django.urls import path

from posttrain.accounts.api import health, views

urlpatterns = [
    path("health/", health.health, name="api-health"),
    path("auth/token/", views.ObtainTokenView.as_view(), name="api-auth-token"),
    path("auth/me/", views.me, name="api-auth-me"),
]
