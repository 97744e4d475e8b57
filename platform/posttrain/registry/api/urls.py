from rest_framework.routers import SimpleRouter

from posttrain.registry.api import datasets, environments, model_assets, rewards

# SimpleRouter: no API root view and no `.json` suffix routes, so every URL under /api/ is one
# endpoint of the permission matrix.
router = SimpleRouter()
router.register("models", model_assets.ModelAssetViewSet, basename="model")
router.register("datasets", datasets.DatasetViewSet, basename="dataset")
router.register("rewards", rewards.RewardFunctionViewSet, basename="reward")
router.register("environments", environments.EnvironmentViewSet, basename="environment")

urlpatterns = router.urls
