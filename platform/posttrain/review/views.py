"""Server-rendered pages of review. Researchers manage campaigns; annotators work their queue; reviewers
adjudicate. Each page is a template plus one ES module in frontend/static/js/ that reads the review API;
the views only check roles, resolve the campaign and embed what the page shows before its first request."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from posttrain.accounts.decorators import researcher_required, role_required
from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import signed_in_user
from posttrain.projects.access import readable
from posttrain.review import selectors
from posttrain.review.models import Campaign

annotator_required = role_required(Role.ANNOTATOR)
reviewer_required = role_required(Role.REVIEWER)


@researcher_required
def campaigns_page(request: HttpRequest) -> HttpResponse:
    return render(request, "review/list.html")


@researcher_required
def campaign_new_page(request: HttpRequest) -> HttpResponse:
    return render(request, "review/new.html")


@researcher_required
def campaign_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    campaign = get_object_or_404(readable(Campaign.objects.all(), request.user), pk=campaign_id)
    return render(
        request,
        "review/detail.html",
        {
            "campaign": campaign,
            "page_data": {"id": campaign.pk, "name": campaign.name, "kind": campaign.kind},
        },
    )


@annotator_required
def queue_page(request: HttpRequest) -> HttpResponse:
    return render(request, "review/queue.html")


@annotator_required
def work_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    # Only campaigns the user is assigned to, as in the API: anything else does not exist for them.
    campaign = get_object_or_404(selectors.annotator_campaigns(signed_in_user(request.user)), pk=campaign_id)
    return render(
        request,
        "review/work.html",
        {
            "campaign": campaign,
            "page_data": {**selectors.campaign_for_annotator(campaign), "state": campaign.state},
        },
    )


@reviewer_required
def adjudicate_queue_page(request: HttpRequest) -> HttpResponse:
    return render(request, "review/adjudicate_queue.html")


@reviewer_required
def adjudicate_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    # Only campaigns the user reviews, as in the API.
    campaign = get_object_or_404(selectors.reviewer_campaigns(signed_in_user(request.user)), pk=campaign_id)
    return render(
        request,
        "review/adjudicate.html",
        {
            "campaign": campaign,
            "page_data": {**selectors.campaign_for_annotator(campaign), "state": campaign.state},
        },
    )
