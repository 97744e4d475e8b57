from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.review.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("review/campaigns", views.CampaignViewSet, basename="review-campaign")

urlpatterns = [
    path("review/annotators/", views.AnnotatorListView.as_view(), name="review-annotators"),
    path("review/queue/", views.QueueView.as_view(), name="review-queue"),
    path("review/campaigns/<int:pk>/next/", views.CampaignNextView.as_view(), name="review-campaign-next"),
    path("review/items/<int:pk>/judgement/", views.ItemJudgementView.as_view(), name="review-item-judgement"),
    path("review/items/<int:pk>/skip/", views.ItemSkipView.as_view(), name="review-item-skip"),
    path("review/items/<int:pk>/release/", views.ItemReleaseView.as_view(), name="review-item-release"),
    *router.urls,
]
