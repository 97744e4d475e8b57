"""Reads of review: campaign lists with progress, the annotator's and the reviewer's view of an item,
results next to the rewards, the items' labels (gold, decisions, weighted votes), the agreement tables
before and after adjudication, and a judge's agreement with the humans.

What an annotator may see is decided here, in `item_for_annotator`, and nowhere else: the prompt, the
reference answer and the response(s) as A/B (with its steps when a question labels them), the
guidelines, and a judge's suggestion when the campaign shows them; in a blind campaign nothing about
rewards, reward components, runs, steps or ids; never another annotator's answers, and nothing that
tells a gold item from another. A reviewer (`item_for_reviewer`) sees every judgement of the item.

One module per concept:

- `progress.py`: campaign lists and progress (the annotator's, the campaign's);
- `annotator_view.py`: what an annotator sees of a campaign and of an item;
- `reviewer_view.py`: the reviewer's campaigns, queue, and an item with every judgement;
- `labels_agreement.py`: the items' labels and the agreement report before and after adjudication;
- `results.py`: the researchers' items and results next to the rewards;
- `judges.py`: judge runs, a judge's answers on items and its agreement with the humans.
"""

from posttrain.review.selectors.annotator_view import campaign_for_annotator, item_for_annotator
from posttrain.review.selectors.judges import judge_agreement, judge_runs, latest_judge
from posttrain.review.selectors.labels_agreement import CampaignLabels, agreement, campaign_labels
from posttrain.review.selectors.progress import (
    annotator_campaigns,
    annotator_items,
    annotator_progress,
    annotator_queue,
    campaign_list,
    campaign_progress,
)
from posttrain.review.selectors.results import (
    RESULT_ORDERINGS,
    SINGLE_DISAGREEMENT_FLAG,
    campaign_items,
    campaign_results,
    pairwise_majority,
)
from posttrain.review.selectors.reviewer_view import (
    item_for_reviewer,
    reviewer_campaigns,
    reviewer_items,
    reviewer_queue,
)

__all__ = [
    "RESULT_ORDERINGS",
    "SINGLE_DISAGREEMENT_FLAG",
    "CampaignLabels",
    "agreement",
    "annotator_campaigns",
    "annotator_items",
    "annotator_progress",
    "annotator_queue",
    "campaign_for_annotator",
    "campaign_items",
    "campaign_labels",
    "campaign_list",
    "campaign_progress",
    "campaign_results",
    "item_for_annotator",
    "item_for_reviewer",
    "judge_agreement",
    "judge_runs",
    "latest_judge",
    "pairwise_majority",
    "reviewer_campaigns",
    "reviewer_items",
    "reviewer_queue",
]
