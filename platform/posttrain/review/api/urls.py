from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.review.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("review/campaigns", views.CampaignViewSet, basename="review-campaign")
router.register("review/judge-runs", views.JudgeRunViewSet, basename="review-judge-run")

urlpatterns = [
    path("review/annotators/", views.AnnotatorListView.as_view(), name="review-annotators"),
    path("review/reviewers/", views.ReviewerListView.as_view(), name="review-reviewers"),
    path("review/queue/", views.QueueView.as_view(), name="review-queue"),
    path("review/campaigns/<int:pk>/next/", views.CampaignNextView.as_view(), name="review-campaign-next"),
    path("review/items/<int:pk>/judgement/", views.ItemJudgementView.as_view(), name="review-item-judgement"),
    path("review/items/<int:pk>/skip/", views.ItemSkipView.as_view(), name="review-item-skip"),
    path("review/items/<int:pk>/release/", views.ItemReleaseView.as_view(), name="review-item-release"),
    path("review/adjudication/", views.AdjudicationQueueView.as_view(), name="review-adjudication"),
    path(
        "review/campaigns/<int:pk>/adjudicate/next/",
        views.CampaignAdjudicateNextView.as_view(),
        name="review-campaign-adjudicate-next",
    ),
    path("review/items/<int:pk>/decision/", views.ItemDecisionView.as_view(), name="review-item-decision"),
    path(
        "review/items/<int:pk>/review-release/",
        views.ItemReviewReleaseView.as_view(),
        name="review-item-review-release",
    ),
    *router.urls,
]
