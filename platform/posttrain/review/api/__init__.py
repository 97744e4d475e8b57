"""REST API of review: thin views over posttrain.review services, selectors, judging and export.

Researchers and admins manage campaigns (CampaignViewSet, AnnotatorListView, ReviewerListView) and judges
(JudgeRunViewSet, the campaign's `judges`). Annotators and admins work their queue (QueueView and the item
views); reviewers and admins adjudicate (AdjudicationQueueView, CampaignAdjudicateNextView,
ItemDecisionView). Annotators and reviewers reach only campaigns they are assigned to: anything else is a
404, as if it did not exist.

One module per resource: campaigns.py, people.py (who may be assigned), judges.py, annotation.py (the
annotators' queue) and adjudication.py (the reviewers').
"""
