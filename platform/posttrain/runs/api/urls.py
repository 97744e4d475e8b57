from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.runs.api import config_views, experiments, external, runs

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
    *router.urls,
]
