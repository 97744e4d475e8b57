"""Trusting a campaign's labels, end to end in headless Chromium, as three users with their own roles: an
annotator labels every item with the keyboard (guidelines and rubric on screen, the first wrong step
marked, gold rows mixed in unmarked); a reviewer adjudicates the items the annotators disagree on; the
owner (the researcher who made the campaign) sees the gold checks and the agreement before and after
adjudication, checked against values computed by hand, and registers the step labels as a dataset.

A second annotator's judgements are stored through the review services before the first one starts (the
same path the API's judgement endpoint takes); the rollouts reach the database the real way
(posttrain.telemetry.ingestion.events_ingest), as the engine sends them."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from posttrain.accounts.services import user_create
from posttrain.registry.models import Dataset
from posttrain.review import services as review
from posttrain.review.models import Campaign, Judgement, ReviewState
from posttrain.runs import services
from posttrain.telemetry.ingestion import events_ingest
from tests.support.browser import PASSWORD, log_in, open_ready, screenshot
from tests.support.pages import without_tokens
from tests.unit.platform.helpers import BASE_CONFIG, default_project, join, registry_rows, sample_record, samples_event

pytestmark = pytest.mark.django_db(transaction=True)

GUIDELINES = "Judge **the arithmetic** first, then how plainly it is said."
RUBRIC = ["Hard to follow.", "Clear enough.", "**Very** clear."]
QUESTIONS = [
    {"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?"},
    {"key": "first_error", "kind": "steps", "label": "Where does it first go wrong?"},
    {"key": "clarity", "kind": "rating", "label": "Clarity", "min": 1, "max": 3, "rubric": RUBRIC},
]
ROLLOUTS = {  # prompt -> response (two steps each: "<a> plus <b>." and "That is <c>.")
    "2+3=": "2 plus 3. That is 5.",
    "4+4=": "4 plus 4. That is 9.",
    "6+1=": "6 plus 1. That is 7.",
    "9-2=": "9 minus 2. That is 6.",
}
GOLD_ROWS = [  # a gold dataset: its labels are the known answers to "correct"
    {"prompt": "1+1=", "response": "1 plus 1. That is 2.", "label": "true"},
    {"prompt": "5+5=", "response": "5 plus 5. That is 11.", "label": "false"},
]
# Answers per prompt: (correct, first wrong step from 0 or None, clarity). ann types hers in the browser.
ANN = {
    "2+3=": (True, None, 3),
    "4+4=": (False, 1, 2),
    "6+1=": (True, None, 3),
    "9-2=": (False, 0, 1),
    "1+1=": (True, None, 3),
    "5+5=": (False, 1, 2),
}
BOB = {
    "2+3=": (True, None, 3),
    "4+4=": (True, None, 3),  # disputes correct and the first wrong step
    "6+1=": (True, None, 1),  # clarity 3 against 1: two points apart, the campaign's spread
    "9-2=": (False, 0, 1),
    "1+1=": (True, None, 3),
    "5+5=": (True, None, 3),  # a gold item: it never goes to review, it checks bob (wrong here)
}
# The reviewer's decisions on the two disputed items.
DECISIONS = {"4+4=": (False, 1), "6+1=": 2}
# Agreement on "correct" over the six items, by hand. ann T F T F T F, bob T T T F T T.
#   Before: p_o = 4/6; ann T 1/2, bob T 5/6: p_e = 1/2·5/6 + 1/2·1/6 = 1/2; κ = (2/3 − 1/2)/(1/2) = 1/3.
#   α (nominal): n = 12, n_T = 8, n_F = 4, two split items (4+4=, 5+5=): α = 1 − 11·4/(2·8·4) = 5/16.
#   After the reviewer decides 4+4= fail, bob's pass there counts as a fail: bob T F T F T T;
#   p_o = 5/6, bob T 4/6: p_e = 1/2; κ = (5/6 − 1/2)/(1/2) = 2/3; n_T = 7, n_F = 5, one split item:
#   α = 1 − 11·2/(2·7·5) = 24/35.
KAPPA_BEFORE, ALPHA_BEFORE, KAPPA_AFTER, ALPHA_AFTER = 1 / 3, 5 / 16, 2 / 3, 24 / 35
# The step labels exported (the dataset's gold rows left out): both say no step is wrong on 2+3= and 6+1=,
# both say the first on 9-2=, the reviewer said the second on 4+4=.
PRM = {
    "2+3=": {"prompt": "2+3=", "steps": ["2 plus 3.", "That is 5."], "labels": [1, 1]},
    "4+4=": {"prompt": "4+4=", "steps": ["4 plus 4.", "That is 9."], "labels": [1, -1]},
    "6+1=": {"prompt": "6+1=", "steps": ["6 plus 1.", "That is 7."], "labels": [1, 1]},
    "9-2=": {"prompt": "9-2=", "steps": ["9 minus 2."], "labels": [-1]},
}


def shown(value: float) -> str:
    return f"{value:.4f}"


@pytest.fixture
def campaign(tmp_path, monkeypatch, settings) -> Campaign:
    """The owner's active campaign over a run's rollouts with gold rows mixed in; bob has judged every item."""
    settings.STORAGE_ROOT = tmp_path / "storage"
    from posttrain.core import dispatch

    monkeypatch.setattr(dispatch, "run_task", lambda task_name, run_id: None)
    owner = join(user_create("rosalind", PASSWORD, "researcher"))
    ann, bob = (user_create(name, PASSWORD, "annotator") for name in ("ann", "bob"))
    rita = user_create("rita", PASSWORD, "reviewer")
    rows = registry_rows(tmp_path, [(prompt, "?") for prompt in ROLLOUTS], sha256="e" * 64)
    experiment = services.experiment_create(
        name="sums",
        model=rows["model"],
        dataset=rows["dataset"],
        rewards=[(rows["exact"], 1.0)],
        config=BASE_CONFIG,
        user=owner,
        project=default_project(),
    )
    run = services.run_launch(experiment, user=owner)
    samples = [
        sample_record(i, reward=1.0, prompt=prompt, response=response, group=i, label=None)
        for i, (prompt, response) in enumerate(ROLLOUTS.items())
    ]
    now = time.time()
    events_ingest(
        run.pk,
        [
            {"run": str(run.id), "seq": 1, "type": "status", "step": None, "time": now, "data": {"state": "running"}},
            samples_event(run, 2, 1, samples),  # the step's rollout file, then its event
        ],
    )
    gold_file = tmp_path / "gold.jsonl"
    gold_file.write_text("".join(json.dumps(row) + "\n" for row in GOLD_ROWS))
    gold = Dataset.objects.create(
        name="known sums",
        sha256=uuid.uuid4().hex * 2,
        format="jsonl",
        path=str(gold_file),
        size_bytes=gold_file.stat().st_size,
        row_count=len(GOLD_ROWS),
        prompt_field="prompt",
        label_field="label",
        columns=["label", "prompt", "response"],
    )
    campaign = review.campaign_create(
        name="check the sums",
        kind="single",
        instructions=GUIDELINES,
        questions=QUESTIONS,
        source={"runs": [str(run.id)], "rule": "random", "k": 4, "seed": 5},
        overlap=2,
        annotators=[ann, bob],
        reviewers=[rita],
        gold={"dataset": gold.pk, "share": 0.3},  # ceil(0.3 · 4 / 0.7) = 2 gold rows
        user=owner,
        project=default_project(),
    )
    review.campaign_activate(campaign)
    for item in campaign.items.select_related("rollout_a", "campaign"):
        correct, first, clarity = BOB[item.rollout_a.prompt]
        answers = {"correct": correct, "first_error": {"first_wrong": first}, "clarity": clarity}
        review.judgement_submit(item, bob, answers)
    return campaign


def wait_for_next(page: Page, box: str) -> None:
    before = page.get_attribute(f"#{box}", "data-item-id")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "([box, before]) => { const el = document.getElementById(box); return el.hidden || el.dataset.itemId !== before; }",
        arg=[box, before],
    )


def current_prompt(page: Page) -> str:
    return page.inner_text("#prompt")


def test_an_annotator_labels_a_reviewer_adjudicates_and_the_owner_exports(web_server, browser, campaign):
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(3)]
    ann_page, rita_page, owner_page = (context.new_page() for context in contexts)
    try:
        annotate(ann_page, web_server, campaign)
        states = dict(campaign.items.values_list("rollout_a__prompt", "review_state"))
        assert {p for p, state in states.items() if state == ReviewState.PENDING} == {"4+4=", "6+1="}
        adjudicate(rita_page, web_server, campaign)
        export_as_owner(owner_page, web_server, campaign)
    finally:
        for context in contexts:
            context.close()


def annotate(page: Page, web_server: str, campaign: Campaign) -> None:
    log_in(page, web_server, "ann")
    # An annotator has no reviewer or researcher pages.
    assert page.goto(f"{web_server}/adjudicate/").status == 403
    assert page.goto(f"{web_server}/review/campaigns/{campaign.pk}/").status == 403
    open_ready(page, f"{web_server}/annotate/{campaign.pk}/")
    # The guidelines beside the item, rendered from markdown.
    expect(page.locator("#guidelines-side-text strong")).to_have_text("the arithmetic")
    seen = set()
    for _ in range(len(ANN)):
        expect(page.locator("#item-box")).to_be_visible()
        prompt = current_prompt(page)
        seen.add(prompt)
        html = without_tokens(page.content()).lower()
        assert "gold" not in html  # nothing marks a gold row
        expect(page.locator("ol.steps-view li")).to_have_count(2)
        correct, first, clarity = ANN[prompt]
        page.keyboard.press("p" if correct else "f")
        page.keyboard.press("j")  # to the steps question
        page.keyboard.press("n" if first is None else str(first + 1))
        if first is not None:
            response = ROLLOUTS[prompt] if prompt in ROLLOUTS else _gold_response(prompt)
            expect(page.locator("ol.steps-view li.wrong-first")).to_have_text(
                response.split(". ")[first].rstrip(".") + "."
            )
        page.keyboard.press("j")  # to the rating
        page.keyboard.press(str(clarity))
        rubric = page.locator('.question[data-key="clarity"] .rubric')
        expect(rubric).to_contain_text(RUBRIC[clarity - 1].replace("**", ""))
        if prompt == "2+3=":
            page.keyboard.press("g")
            expect(page.locator("#guidelines-dialog")).to_be_visible()
            expect(page.locator("#guidelines-dialog .rubric-table tr")).to_have_count(3)
            screenshot(page, "annotate-guidelines-rubric")
            page.keyboard.press("g")
            expect(page.locator("#guidelines-dialog")).to_be_hidden()
            screenshot(page, "annotate-steps-item")
        wait_for_next(page, "item-box")
    expect(page.locator("#done-title")).to_have_text("All done")
    assert seen == set(ANN)  # the four rollouts and the two gold rows, mixed in
    for judgement in Judgement.objects.filter(item__campaign=campaign, annotator__username="ann").select_related(
        "item__rollout_a"
    ):
        correct, first, clarity = ANN[judgement.item.rollout_a.prompt]
        assert judgement.answers == {"correct": correct, "first_error": {"first_wrong": first}, "clarity": clarity}


def _gold_response(prompt: str) -> str:
    return next(row["response"] for row in GOLD_ROWS if row["prompt"] == prompt)


def adjudicate(page: Page, web_server: str, campaign: Campaign) -> None:
    log_in(page, web_server, "rita")
    assert page.goto(f"{web_server}/annotate/").status == 403
    open_ready(page, f"{web_server}/adjudicate/")
    expect(page.locator(f'.queue-entry[data-campaign-id="{campaign.pk}"]')).to_contain_text("2 waiting")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{web_server}/adjudicate/{campaign.pk}/")
    page.wait_for_selector("body[data-ready=true]")
    for _ in range(len(DECISIONS)):
        expect(page.locator("#item-box")).to_be_visible()
        prompt = current_prompt(page)
        table = page.locator("#judgements-table")
        expect(table.locator('tr[data-annotator="ann"]')).to_be_visible()
        expect(table.locator('tr[data-annotator="bob"]')).to_be_visible()
        if prompt == "4+4=":
            expect(table.locator("th.disputed")).to_have_count(2)
            screenshot(page, "adjudicate-item")
            correct, first = DECISIONS[prompt]
            page.keyboard.press("f" if not correct else "p")
            page.keyboard.press("j")
            page.keyboard.press(str(first + 1))
        else:
            expect(table.locator("th.disputed")).to_have_text(["Clarity (disputed)"])
            page.keyboard.press(str(DECISIONS[prompt]))  # the focus starts on the disputed question
        wait_for_next(page, "item-box")
    expect(page.locator("#done-title")).to_have_text("Nothing waiting")
    decided = {
        item.rollout_a.prompt: item
        for item in campaign.items.filter(review_state=ReviewState.DECIDED).select_related("rollout_a", "decided_by")
    }
    assert set(decided) == set(DECISIONS) and {i.decided_by.username for i in decided.values()} == {"rita"}
    assert decided["4+4="].decision == {"correct": False, "first_error": {"first_wrong": 1}, "clarity": 2}
    assert decided["6+1="].decision == {"correct": True, "first_error": {"first_wrong": None}, "clarity": 2}


def export_as_owner(page: Page, web_server: str, campaign: Campaign) -> None:
    log_in(page, web_server, "rosalind")
    open_ready(page, f"{web_server}/review/campaigns/{campaign.pk}/")
    expect(page.locator("#review-summary")).to_have_text("0 waiting for a reviewer · 2 decided · 2 gold")
    correct = page.locator('#agreement-table tr[data-question="correct"]')
    expect(correct.locator("td.kappa")).to_have_text(shown(KAPPA_BEFORE))
    expect(correct.locator("td.alpha")).to_have_text(shown(ALPHA_BEFORE))
    expect(correct.locator("td.kappa-after")).to_have_text(shown(KAPPA_AFTER))
    expect(correct.locator("td.alpha-after")).to_have_text(shown(ALPHA_AFTER))
    gold = page.locator("#gold-table")
    expect(gold.locator('tr[data-annotator="ann"] td.accuracy')).to_have_text("100%")
    expect(gold.locator('tr[data-annotator="bob"] td.accuracy')).to_have_text("50%")
    screenshot(page, "review-campaign-trust")
    page.select_option("#register-format", "prm")
    page.fill("#register-name", "sums step labels")
    page.click("#register-button")
    expect(page.locator("#registered-dataset")).to_contain_text("Dataset “sums step labels”: 4 rows")
    dataset = Dataset.objects.get(source_campaign_id=campaign.pk)
    records = [json.loads(line) for line in Path(dataset.path).read_text().splitlines()]
    assert {record["prompt"]: record for record in records} == PRM
