from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.telemetry.api import alerts, compare, events, ledger, rollouts, run_reads
from posttrain.telemetry.api.stream import run_stream_view

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("runs", run_reads.RunReadsViewSet, basename="run")

urlpatterns = [
    # The engine posts with or without the trailing slash (a POST cannot be redirected).
    path("runs/<uuid:pk>/events", events.RunEventsNoSlashView.as_view(), name="run-events-no-slash"),
    path("runs/<uuid:pk>/events/", events.RunEventsView.as_view(), name="run-events"),
    path("runs/<uuid:pk>/stream/", run_stream_view, name="run-stream"),
    path("runs/<uuid:pk>/ledger/", ledger.RunLedgerView.as_view(), name="run-ledger"),
    path("runs/<uuid:pk>/ledger/file", ledger.RunLedgerFileView.as_view(), name="run-ledger-file"),
    path("runs/<uuid:pk>/rollouts/", rollouts.RunRolloutFilesView.as_view(), name="run-rollout-files"),
    path("runs/<uuid:pk>/rollouts/<str:name>", rollouts.RunRolloutFileView.as_view(), name="run-rollout-file"),
    path("runs/<uuid:pk>/rollouts/<str:name>/upload", rollouts.RolloutUploadView.as_view(), name="run-rollout-upload"),
    path("runs/<uuid:pk>/alerts/", alerts.RunAlertsView.as_view(), name="run-alerts"),
    path("compare/", compare.CompareView.as_view(), name="api-compare"),
    path("compare/prompts/", compare.ComparePromptsView.as_view(), name="api-compare-prompts"),
    path("compare/samples/", compare.CompareSamplesView.as_view(), name="api-compare-samples"),
    *router.urls,
]
