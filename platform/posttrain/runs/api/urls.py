from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.runs.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("experiments", views.ExperimentViewSet, basename="experiment")
router.register("runs", views.RunViewSet, basename="run")

urlpatterns = [
    # The engine posts with or without the trailing slash (a POST cannot be redirected).
    path("runs/<uuid:pk>/events", views.RunEventsNoSlashView.as_view(), name="run-events-no-slash"),
    path("runs/<uuid:pk>/events/", views.RunEventsView.as_view(), name="run-events"),
    *router.urls,
]
