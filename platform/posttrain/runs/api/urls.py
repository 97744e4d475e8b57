from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.runs.api import compare, config_views, experiments, external, runs
from posttrain.runs.api.diagnostics import RunAlertsView

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("experiments", experiments.ExperimentViewSet, basename="experiment")
router.register("runs", runs.RunViewSet, basename="run")

urlpatterns = [
    # Before the router: `experiments/validate/` is not an experiment's id.
    path("experiments/validate/", config_views.ExperimentValidateView.as_view(), name="experiment-validate"),
    path("runs/external/", external.ExternalRunCreateView.as_view(), name="run-external-create"),
    path("config/schema/", config_views.ConfigSchemaView.as_view(), name="config-schema"),
    path("config/yaml/", config_views.ConfigYamlView.as_view(), name="config-yaml"),
    path("runs/<uuid:pk>/alerts/", RunAlertsView.as_view(), name="run-alerts"),
    path("compare/", compare.CompareView.as_view(), name="api-compare"),
    path("compare/prompts/", compare.ComparePromptsView.as_view(), name="api-compare-prompts"),
    path("compare/samples/", compare.CompareSamplesView.as_view(), name="api-compare-samples"),
    *router.urls,
]
