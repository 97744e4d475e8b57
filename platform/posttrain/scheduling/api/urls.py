from django.urls import path

from posttrain.scheduling.api import views

urlpatterns = [
    path("queue/", views.QueueView.as_view(), name="api-queue"),
    path("queue/stats/", views.QueueStatsView.as_view(), name="api-queue-stats"),
    # Prometheus scrapes `…/metrics` as it is written: with or without the slash.
    path("queue/metrics", views.QueueMetricsView.as_view(), name="api-queue-metrics"),
    path("queue/metrics/", views.QueueMetricsView.as_view(), name="api-queue-metrics-slash"),
]
