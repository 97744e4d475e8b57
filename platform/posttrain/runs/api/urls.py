from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.runs.api import compare, config_views, rollout_views, views
from posttrain.runs.api.browser_stream_view import run_stream_view
from posttrain.runs.api.diagnostics import RunAlertsView

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("experiments", views.ExperimentViewSet, basename="experiment")
router.register("runs", views.RunViewSet, basename="run")

urlpatterns = [
    # Before the router: `experiments/validate/` is not an experiment's id.
    path("experiments/validate/", config_views.ExperimentValidateView.as_view(), name="experiment-validate"),
    path("runs/external/", views.ExternalRunCreateView.as_view(), name="run-external-create"),
    path("config/schema/", config_views.ConfigSchemaView.as_view(), name="config-schema"),
    path("config/yaml/", config_views.ConfigYamlView.as_view(), name="config-yaml"),
    # The engine posts with or without the trailing slash (a POST cannot be redirected).
    path("runs/<uuid:pk>/events", views.RunEventsNoSlashView.as_view(), name="run-events-no-slash"),
    path("runs/<uuid:pk>/events/", views.RunEventsView.as_view(), name="run-events"),
    path("runs/<uuid:pk>/stream/", run_stream_view, name="run-stream"),
    path("runs/<uuid:pk>/rollouts/", rollout_views.RunRolloutFilesView.as_view(), name="run-rollout-files"),
    path("runs/<uuid:pk>/rollouts/<str:name>", rollout_views.RunRolloutFileView.as_view(), name="run-rollout-file"),
    path(
        "runs/<uuid:pk>/rollouts/<str:name>/upload",
        rollout_views.RolloutUploadView.as_view(),
        name="run-rollout-upload",
    ),
    path("runs/<uuid:pk>/alerts/", RunAlertsView.as_view(), name="run-alerts"),
    path("compare/", compare.CompareView.as_view(), name="api-compare"),
    path("compare/prompts/", compare.ComparePromptsView.as_view(), name="api-compare-prompts"),
    path("compare/samples/", compare.CompareSamplesView.as_view(), name="api-compare-samples"),
    *router.urls,
]
