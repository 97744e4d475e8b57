from rest_framework.routers import SimpleRouter

from posttrain.registry.api import views

# SimpleRouter: no API root view and no `.json` suffix routes, so every URL under /api/ is one
# endpoint of the permission matrix.
router = SimpleRouter()
router.register("models", views.ModelAssetViewSet, basename="model")
router.register("datasets", views.DatasetViewSet, basename="dataset")
router.register("rewards", views.RewardFunctionViewSet, basename="reward")
router.register("environments", views.EnvironmentViewSet, basename="environment")

urlpatterns = router.urls
