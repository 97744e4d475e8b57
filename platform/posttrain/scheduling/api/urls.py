from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.scheduling.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("runs", views.RunPriorityViewSet, basename="run")

urlpatterns = [
    path("queue/", views.QueueView.as_view(), name="api-queue"),
    path("queue/stats/", views.QueueStatsView.as_view(), name="api-queue-stats"),
    # Prometheus scrapes `…/metrics` as it is written: with or without the slash.
    path("queue/metrics", views.QueueMetricsView.as_view(), name="api-queue-metrics"),
    path("queue/metrics/", views.QueueMetricsView.as_view(), name="api-queue-metrics-slash"),
    *router.urls,
]
