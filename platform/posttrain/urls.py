from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from posttrain.core import views as core_views
from posttrain.projects import views as project_views
from posttrain.registry import views as registry_views
from posttrain.review import views as review_views
from posttrain.runs import views as run_views
from posttrain.scheduling import views as scheduling_views
from posttrain.telemetry import views as telemetry_views

urlpatterns = [
    path("", core_views.home, name="home"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("runs/", run_views.runs_page, name="runs"),
    path("runs/<uuid:run_id>/", telemetry_views.run_page, name="run"),
    path("compare/", run_views.compare_page, name="compare"),
    path("queue/", scheduling_views.queue_page, name="queue"),
    path("launch/", run_views.launch_page, name="launch"),
    path("registry/", registry_views.registry_page, name="registry"),
    path("projects/", project_views.projects_page, name="projects"),
    path("review/", review_views.campaigns_page, name="review"),
    path("review/new/", review_views.campaign_new_page, name="review-new"),
    path("review/campaigns/<int:campaign_id>/", review_views.campaign_page, name="review-campaign-page"),
    path("annotate/", review_views.queue_page, name="annotate"),
    path("annotate/<int:campaign_id>/", review_views.work_page, name="annotate-campaign"),
    path("adjudicate/", review_views.adjudicate_queue_page, name="adjudicate"),
    path("adjudicate/<int:campaign_id>/", review_views.adjudicate_page, name="adjudicate-campaign"),
    path("admin/", admin.site.urls),
    path("api/", include("posttrain.registry.api.urls")),
    path("api/", include("posttrain.telemetry.api.urls")),  # before runs: its paths under runs/<id>/ come first
    path("api/", include("posttrain.runs.api.urls")),
    path("api/", include("posttrain.scheduling.api.urls")),
    path("api/", include("posttrain.accounts.api.urls")),
    path("api/", include("posttrain.projects.api.urls")),
    path("api/", include("posttrain.review.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
