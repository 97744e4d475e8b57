from django.urls import path
from rest_framework.routers import SimpleRouter

from posttrain.projects.api import views

router = SimpleRouter()
router.register("projects", views.ProjectViewSet, basename="project")

urlpatterns = [
    path("projects/current/", views.CurrentProjectView.as_view(), name="api-project-current"),
    *router.urls,
]
