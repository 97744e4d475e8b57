from django.urls import path
from rest_framework.routers import DefaultRouter

from posttrain.review.api import adjudication, annotation, campaigns, judges, people

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("review/campaigns", campaigns.CampaignViewSet, basename="review-campaign")
router.register("review/judge-runs", judges.JudgeRunViewSet, basename="review-judge-run")

urlpatterns = [
    path("review/annotators/", people.AnnotatorListView.as_view(), name="review-annotators"),
    path("review/reviewers/", people.ReviewerListView.as_view(), name="review-reviewers"),
    path("review/queue/", annotation.QueueView.as_view(), name="review-queue"),
    path("review/campaigns/<int:pk>/next/", annotation.CampaignNextView.as_view(), name="review-campaign-next"),
    path("review/items/<int:pk>/judgement/", annotation.ItemJudgementView.as_view(), name="review-item-judgement"),
    path("review/items/<int:pk>/skip/", annotation.ItemSkipView.as_view(), name="review-item-skip"),
    path("review/items/<int:pk>/release/", annotation.ItemReleaseView.as_view(), name="review-item-release"),
    path("review/adjudication/", adjudication.AdjudicationQueueView.as_view(), name="review-adjudication"),
    path(
        "review/campaigns/<int:pk>/adjudicate/next/",
        adjudication.CampaignAdjudicateNextView.as_view(),
        name="review-campaign-adjudicate-next",
    ),
    path("review/items/<int:pk>/decision/", adjudication.ItemDecisionView.as_view(), name="review-item-decision"),
    path(
        "review/items/<int:pk>/review-release/",
        adjudication.ItemReviewReleaseView.as_view(),
        name="review-item-review-release",
    ),
    *router.urls,
]
