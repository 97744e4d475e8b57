from django.urls import path

from posttrain.accounts.api import views

urlpatterns = [
    path("auth/token/", views.ObtainTokenView.as_view(), name="api-auth-token"),
    path("auth/me/", views.me, name="api-auth-me"),
]
