"""Annotator review end to end, in headless Chromium: a researcher creates a campaign in the form and
activates it; two annotators, each in their own browser session, work their queues with the keyboard
only (no clicks after logging in); the researcher sees the agreement, checked here against values
computed by hand, and the judgements next to the rewards, and registers the export as a dataset.

The rollouts arrive the real way: each step's rollout file written into the store the web server reads,
then its samples event ingested (posttrain.telemetry.ingestion.events_ingest), as the engine does."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from posttrain.registry.models import Dataset
from posttrain.review.models import Campaign, Judgement, ReviewItem
from posttrain.runs import services
from posttrain.runs.models import Run
from posttrain.telemetry.ingestion import events_ingest
from tests.support.browser import PASSWORD, open_ready, screenshot
from tests.unit.platform.helpers import BASE_CONFIG, default_project, join, registry_rows, sample_record, samples_event

pytestmark = pytest.mark.django_db(transaction=True)

RUN_NAME = "secret-run-name"
ANNOTATORS = ("ann", "bob")
INSTRUCTIONS = "Judge the arithmetic: is the answer to the sum right, and is it said plainly?"

# Step 1: one response per prompt (the single campaign). "5+1=" has reward 1, but both annotators fail it:
# the one item where the humans disagree with the reward.
SINGLE_STEP = 1
SINGLE_SAMPLES = [("2+2=", "4", 1.0), ("3+4=", "8", 0.0), ("5+1=", "6 or maybe 7", 1.0), ("9-3=", "5", 0.0)]
# Step 2: two different responses per prompt group (the pair campaign).
PAIR_STEP = 2
PAIR_SAMPLES = [("1+1=", "2", "3"), ("2+3=", "5", "6"), ("4+4=", "8", "9"), ("6+1=", "7", "1")]

# The form derives question keys from the labels.
QUALITY, CORRECT, PROBLEMS = "overall_quality", "is_the_answer_correct", "problems"
BETTER, WHY = "which_response_is_better", "anything_else"

# Single items, per prompt and annotator: (quality 1-5, correct?, problems).
SINGLE_ANSWERS = {
    "2+2=": {"ann": (5, True, ["rambling"]), "bob": (4, True, ["rambling"])},
    "3+4=": {"ann": (4, True, []), "bob": (4, False, [])},
    "5+1=": {"ann": (2, False, []), "bob": (1, False, [])},
    "9-3=": {"ann": (1, False, []), "bob": (2, False, [])},
}
# Agreement on those answers, by hand.
# correct (pass/fail): ann T T F F, bob T F F F.
#   Cohen: p_o = 3/4, p_e = 2/4·1/4 + 2/4·3/4 = 1/2, κ = (3/4 − 1/2) / (1 − 1/2) = 1/2.
#   Krippendorff (nominal): n = 8 values, n_T = 3, n_F = 5; the one split item gives o_TF = o_FT = 1:
#   α = 1 − (n − 1)·(o_TF + o_FT) / (n_T·n_F + n_F·n_T) = 1 − 7·2/30 = 8/15.
CORRECT_KAPPA = (3 / 4 - 1 / 2) / (1 - 1 / 2)
CORRECT_ALPHA = 1 - 7 * 2 / 30
# quality (1-5): ann 5 4 2 1, bob 4 4 1 2.
#   Cohen, quadratic weights w = (i − j)²/(5 − 1)²: observed mean weight (1 + 0 + 1 + 1)/16/4 = 3/64;
#   expected Σ p_ann(i)·p_bob(j)·w(i, j) = (6.75 + 3.25 + 2.25 + 4.75)/4/16 = 17/64; κ = 1 − 3/17 = 14/17.
#   Krippendorff (interval, δ² = (c − k)²): values 5:1, 4:3, 2:2, 1:2 (n = 8); observed Σ o·δ² =
#   2·1 (5 vs 4) + 4·1 (2 vs 1, twice) = 6; expected Σ n_c·n_k·δ² = 2·(1·3·1 + 1·2·9 + 1·2·16 + 3·2·4
#   + 3·2·9 + 2·2·1) = 270; α = 1 − 7·6/270 = 38/45.
QUALITY_KAPPA = 1 - (3 / 64) / (17 / 64)
QUALITY_ALPHA = 1 - 7 * 6 / 270
# problems: both picked "rambling" on "2+2=" only: full agreement; nobody ever picked "wrong format",
# so its agreement is undefined ("—").
RAMBLING_KAPPA = RAMBLING_ALPHA = 1.0

# Pair items, per prompt and annotator, as stored ("A" = the item's rollout_a; the page may show it as B).
PAIR_ANSWERS = {
    "1+1=": {"ann": "A", "bob": "A"},
    "2+3=": {"ann": "A", "bob": "B"},
    "4+4=": {"ann": "B", "bob": "B"},
    "6+1=": {"ann": "tie", "bob": "tie"},
}
# Cohen (nominal): p_o = 3/4; ann A 2/4, B 1/4, tie 1/4; bob A 1/4, B 2/4, tie 1/4;
#   p_e = 2/16 + 2/16 + 1/16 = 5/16; κ = (3/4 − 5/16) / (1 − 5/16) = 7/11.
# Krippendorff (nominal): n_A = 3, n_B = 3, n_tie = 2 (n = 8), one split item (o_AB = o_BA = 1):
#   α = 1 − 7·2 / (8² − 3² − 3² − 2²) = 1 − 14/42 = 2/3.
BETTER_KAPPA = (3 / 4 - 5 / 16) / (1 - 5 / 16)
BETTER_ALPHA = 1 - 7 * 2 / 42
# Preference pairs exported: "1+1=" (both A) and "4+4=" (both B); the split and the tie give none.
# A comment typed with letters that are shortcuts elsewhere on the page.
COMMENT = "a bad sketch? just a tie, x k j s p f"
SWAPPED = {"A": "B", "B": "A"}


def shown(value: str) -> str:
    return f"{value:.4f}"


# --- set-up ---------------------------------------------------------------------------------------


@pytest.fixture
def people(tmp_path, monkeypatch, storage):
    """A researcher, two annotators, and a run whose rollouts arrived as the engine sends them (no Celery
    worker: the run gets its files and events by hand)."""
    from posttrain.accounts.services import user_create
    from posttrain.core import dispatch

    monkeypatch.setattr(dispatch, "run_task", lambda task_name, run_id: None)
    researcher = join(user_create("rosalind", PASSWORD, "researcher"), "maintainer")
    for name in ANNOTATORS:
        user_create(name, PASSWORD, "annotator")
    return researcher, _run_with_samples(tmp_path, researcher)


def _run_with_samples(folder: Path, user) -> Run:
    rows = registry_rows(folder, [(p, "?") for p, *_ in SINGLE_SAMPLES + PAIR_SAMPLES], sha256="c" * 64)
    model, dataset, reward = rows["model"], rows["dataset"], rows["exact"]
    experiment = services.experiment_create(
        name="sums grpo",
        model=model,
        dataset=dataset,
        rewards=[(reward, 1.0)],
        config=BASE_CONFIG,
        user=user,
        project=default_project(),
    )
    run = services.run_launch(experiment, user=user)
    Run.objects.filter(pk=run.pk).update(name=RUN_NAME)
    single = [
        sample_record(i, reward=reward_, prompt=prompt, response=response, group=i, label=None)
        for i, (prompt, response, reward_) in enumerate(SINGLE_SAMPLES)
    ]
    pairs = [
        sample_record(2 * g + j, reward=1.0 - j, prompt=prompt, response=response, group=g, label=None)
        for g, (prompt, *responses) in enumerate(PAIR_SAMPLES)
        for j, response in enumerate(responses)
    ]
    now = time.time()
    events = [
        {"run": str(run.id), "seq": 1, "type": "status", "step": None, "time": now, "data": {"state": "running"}},
        samples_event(run, 2, SINGLE_STEP, single),
        samples_event(run, 3, PAIR_STEP, pairs),
    ]
    events_ingest(run.pk, events)
    assert sum(run.rollout_files.values_list("rows", flat=True)) == len(single) + len(pairs)
    return run


# --- browser helpers ------------------------------------------------------------------------------


def log_in(page: Page, web_server: str, username: str) -> None:
    """With the keyboard: the username field has autofocus."""
    page.goto(f"{web_server}/login/")
    page.wait_for_function("() => document.activeElement && document.activeElement.id === 'id_username'")
    page.keyboard.type(username)
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{web_server}/")


def create_campaign_in_form(
    page: Page,
    web_server: str,
    run: Run,
    *,
    name: str,
    kind: str,
    step: int,
    extra_question: tuple[str, str, dict[str, str]],
) -> Campaign:
    """Fills the new-campaign form (blind, overlap 2, both annotators); a first try with k = 0 must come
    back with the error next to the k field. Returns the created campaign, on whose page the browser is."""
    open_ready(page, f"{web_server}/review/new/")
    page.fill("#c-name", name)
    page.fill("#c-instructions", INSTRUCTIONS)
    if kind == "pair":
        page.check('input[name="kind"][value="pair"]')
        expect(page.locator(".q-editor")).to_have_count(1)
        expect(page.locator('.q-editor[data-index="0"]')).to_have_attribute("data-kind", "pairwise")
    else:
        expect(page.locator(".q-editor")).to_have_count(2)  # the defaults: a 1-5 rating and pass/fail
        expect(page.locator('.q-editor[data-index="0"] [data-field="max"]')).to_have_value("5")
        # Pass/fail first: the results page then judges each item by its pass rate.
        page.click('.q-editor[data-index="1"] button[aria-label="Move question 2 up"]')
        expect(page.locator('.q-editor[data-index="0"]')).to_have_attribute("data-kind", "pass_fail")
    extra_kind, extra_label, extra_fields = extra_question
    page.select_option("#question-add", extra_kind)
    editor = page.locator(".q-editor").last
    editor.locator('[data-field="label"]').fill(extra_label)
    for field, value in extra_fields.items():
        editor.locator(f'[data-field="{field}"]').fill(value)

    page.fill("#run-search", "secret")
    page.locator(f'#run-results button[data-run-id="{run.id}"]').click()
    expect(page.locator("#chosen-runs")).to_contain_text(RUN_NAME)
    page.fill("#steps-list", str(step))
    expect(page.locator('input[name="steps-mode"][value="list"]')).to_be_checked()
    for annotator in ANNOTATORS:
        page.check(f'input[name="annotator"][value="{annotator}"]')
    page.fill("#c-overlap", "2")
    expect(page.locator("#c-blind")).to_be_checked()  # blind by default

    page.fill("#c-k", "0")
    page.click("#create-button")
    expect(page.locator('[data-loc~="source.k"] > .field-error')).to_have_text(
        "must be an integer from 1 to 1000 (items per step)"
    )
    expect(page.locator("#form-status")).to_have_text("1 problem to fix")
    screenshot(page, f"review-new-{kind}-error")
    page.fill("#c-k", "4")
    page.click("#create-button")
    page.wait_for_url(re.compile(r".*/review/campaigns/\d+/$"))
    page.wait_for_selector("body[data-ready=true]")
    campaign = Campaign.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[-1]))
    assert (campaign.name, campaign.kind, campaign.blind, campaign.overlap) == (name, kind, True, 2)
    assert sorted(campaign.annotators.values_list("username", flat=True)) == list(ANNOTATORS)
    assert campaign.items.count() == 4
    return campaign


def activate(page: Page) -> None:
    expect(page.locator("#campaign-state")).to_have_text("draft")
    page.click("#activate-button")
    expect(page.locator("#campaign-state")).to_have_text("active")
    expect(page.locator("#activate-button")).to_be_hidden()


@pytest.fixture
def annotator_pages(browser, web_server, people) -> Iterator[dict[str, Page]]:
    """One browser context (its own cookies: a separate session) per annotator, logged in."""
    contexts = {name: browser.new_context(viewport={"width": 1280, "height": 860}) for name in ANNOTATORS}
    pages = {name: context.new_page() for name, context in contexts.items()}
    for name, page in pages.items():
        log_in(page, web_server, name)
    yield pages
    for context in contexts.values():
        context.close()


def start_first_open_campaign(page: Page, web_server: str, campaign: Campaign, shot: str | None = None) -> None:
    """The queue page focuses the first campaign with work left: Enter opens it."""
    open_ready(page, f"{web_server}/annotate/")
    expect(page.locator(f'.queue-entry[data-campaign-id="{campaign.pk}"] a.start')).to_be_focused()
    if shot:
        screenshot(page, shot)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{web_server}/annotate/{campaign.pk}/")
    page.wait_for_selector("body[data-ready=true]")


def settled(page: Page) -> str:
    """'item' (an item shows), or the done box's state: 'done' or 'waiting' (others hold the rest)."""
    page.wait_for_function(
        "() => document.getElementById('annotate-app').dataset.busy !== 'true' && "
        "(!document.getElementById('item-box').hidden || !document.getElementById('done-box').hidden)"
    )
    if page.locator("#item-box").is_visible():
        return "item"
    return page.get_attribute("#done-box", "data-state")


def press_and_wait_for_next(page: Page, key: str) -> None:
    """Presses Enter or S and waits until the page moved on (another item, or the done box)."""
    before = page.get_attribute("#item-box", "data-item-id")
    page.keyboard.press(key)
    page.wait_for_function(
        "(before) => { const box = document.getElementById('item-box'); return box.hidden || box.dataset.itemId !== before; }",
        arg=before,
    )


def work_until_done(pages: dict[str, Page], judge: Callable[[str, Page, str], None]) -> None:
    """Both annotators work at once, one item each in turn, until both are done. When the other holds the
    last item one still needs, the page says so, and R asks again."""
    done: set[str] = set()
    for _ in range(60):
        for name, page in pages.items():
            if name in done:
                continue
            status = settled(page)
            if status == "done":
                done.add(name)
            elif status == "waiting":
                page.keyboard.press("r")
            else:
                judge(name, page, page.inner_text("#prompt"))
        if done == set(pages):
            return
    pytest.fail(f"the annotators did not finish; done: {sorted(done)}")


def focused_question(page: Page) -> str | None:
    """The key of the question that has the keyboard focus. (Playwright's to_be_focused also wants the
    window focused, which only one of the annotators' windows is at a time.)"""
    return page.evaluate("() => document.activeElement.closest('#questions .question')?.dataset.key ?? null")


def assert_shows_nothing_about_the_run(page: Page, run: Run) -> None:
    html = page.content()
    assert RUN_NAME not in html and str(run.id) not in html
    text = page.inner_text("#annotate-app").lower()
    assert "reward" not in text and "step" not in text


# --- the tests ------------------------------------------------------------------------------------


def test_single_items_are_rated_by_two_annotators_with_the_keyboard_and_their_agreement_is_shown(
    web_server, page, people, annotator_pages
):
    _, run = people
    pages = annotator_pages
    # Annotators cannot open the researchers' pages.
    for path in ("/review/", "/review/new/"):
        assert pages["ann"].goto(f"{web_server}{path}").status == 403

    log_in(page, web_server, "rosalind")
    open_ready(page, f"{web_server}/review/")
    expect(page.locator("#campaigns-box")).to_contain_text("No campaigns yet")
    campaign = create_campaign_in_form(
        page,
        web_server,
        run,
        name="check the sums",
        kind="single",
        step=SINGLE_STEP,
        extra_question=("tags", "Problems", {"options": "rambling, wrong format"}),
    )
    assert [q["key"] for q in campaign.questions] == [CORRECT, QUALITY, PROBLEMS]
    screenshot(page, "review-campaign-draft")
    activate(page)
    assert pages["ann"].goto(f"{web_server}/review/campaigns/{campaign.pk}/").status == 403
    open_ready(page, f"{web_server}/review/")
    expect(page.locator(f'#campaigns-table tr[data-campaign-id="{campaign.pk}"]')).to_contain_text(
        "0 of 8 judgements · 0 of 4 items done"
    )
    screenshot(page, "review-campaigns-list")

    for name, annotator_page in pages.items():
        start_first_open_campaign(
            annotator_page, web_server, campaign, shot="annotate-queue" if name == "ann" else None
        )
    ann = pages["ann"]
    assert settled(ann) == "item"
    expect(ann.locator("#guidelines-side-text")).to_have_text(INSTRUCTIONS)
    expect(ann.locator("#progress-text")).to_have_text("0 of 4 judged")
    assert_shows_nothing_about_the_run(ann, run)
    assert focused_question(ann) == CORRECT  # autofocus: keys work at once
    screenshot(ann, "annotate-single-item")

    ann.keyboard.press("?")
    expect(ann.locator("#help-dialog")).to_be_visible()
    screenshot(ann, "annotate-keys-help")
    ann.keyboard.press("Escape")
    expect(ann.locator("#help-dialog")).to_be_hidden()

    # Enter with required questions unanswered names them and stays on the item.
    first_item = ann.get_attribute("#item-box", "data-item-id")
    ann.keyboard.press("Enter")
    expect(ann.locator("#missing")).to_have_text("Answer first: Is the answer correct?, Overall quality")
    expect(ann.locator(f'.question[data-key="{QUALITY}"]')).to_have_class(re.compile(r"\bmissing\b"))
    assert ann.get_attribute("#item-box", "data-item-id") == first_item
    screenshot(ann, "annotate-missing-answers")
    # S puts the item off: another one shows, and the skipped one comes back at the end.
    press_and_wait_for_next(ann, "s")
    assert ann.get_attribute("#item-box", "data-item-id") != first_item

    def judge(name: str, page_: Page, prompt: str) -> None:
        quality, correct, problems = SINGLE_ANSWERS[prompt][name]
        page_.keyboard.press("p" if correct else "f")
        if name == "bob" and quality < 5:  # one step above, then the arrow key down to it
            page_.keyboard.press(str(quality + 1))
            page_.keyboard.press("ArrowLeft")
        else:
            page_.keyboard.press(str(quality))
        page_.keyboard.press("j")  # from the rating (just answered, so focused) to the tags
        assert focused_question(page_) == PROBLEMS
        if "rambling" in problems:
            page_.keyboard.press("1")
        selected = page_.locator('#questions button.choice[aria-pressed="true"]')
        expect(selected).to_have_count(2 + len(problems))
        if name == "ann" and prompt == "2+2=":
            screenshot(page_, "annotate-single-answered")
        press_and_wait_for_next(page_, "Enter")

    work_until_done(pages, judge)
    for annotator_page in pages.values():
        expect(annotator_page.locator("#done-title")).to_have_text("All done")
        expect(annotator_page.locator("#progress-text")).to_have_text("4 of 4 judged")
    screenshot(ann, "annotate-all-done")

    # What was stored is what the keys said, for every item and annotator.
    for judgement in Judgement.objects.filter(item__campaign=campaign).select_related("item__rollout_a", "annotator"):
        quality, correct, problems = SINGLE_ANSWERS[judgement.item.rollout_a.prompt][judgement.annotator.username]
        assert judgement.answers == {QUALITY: quality, CORRECT: correct, PROBLEMS: problems}
        assert judgement.seconds > 0
    assert Judgement.objects.filter(item__campaign=campaign).count() == 8

    # The researcher's page: progress, agreement equal to the hand-computed values, judgements next to rewards.
    open_ready(page, f"{web_server}/review/campaigns/{campaign.pk}/")
    expect(page.locator("#progress-summary")).to_contain_text("8 of 8 judgements · 4 of 4 items done")
    for name in ANNOTATORS:
        expect(page.locator(f'#annotator-progress tr[data-annotator="{name}"] td.judged')).to_have_text("4 of 4")
    agreement = page.locator("#agreement-table")
    expect(agreement.locator(f'tr[data-question="{CORRECT}"] td.kappa')).to_have_text(shown(CORRECT_KAPPA))
    expect(agreement.locator(f'tr[data-question="{CORRECT}"] td.alpha')).to_have_text(shown(CORRECT_ALPHA))
    expect(agreement.locator(f'tr[data-question="{QUALITY}"] td.kappa')).to_have_text(shown(QUALITY_KAPPA))
    expect(agreement.locator(f'tr[data-question="{QUALITY}"] td.alpha')).to_have_text(shown(QUALITY_ALPHA))
    expect(agreement.locator(f'tr[data-question="{QUALITY}"] td.items')).to_have_text("4")
    rambling = agreement.locator(f'tr[data-question="{PROBLEMS}"][data-tag="rambling"]')
    expect(rambling.locator("td.kappa")).to_have_text(shown(RAMBLING_KAPPA))
    expect(rambling.locator("td.alpha")).to_have_text(shown(RAMBLING_ALPHA))
    expect(agreement.locator(f'tr[data-question="{PROBLEMS}"][data-tag="wrong format"] td.kappa')).to_have_text("—")
    expect(page.locator('#annotator-stats tr[data-annotator="ann"]')).to_contain_text("pass 50%")

    item = ReviewItem.objects.get(campaign=campaign, rollout_a__prompt="2+2=")
    row = page.locator(f'#results-table tr[data-item="{item.pk}"]')
    expect(row).to_contain_text("reward 1")
    expect(row.locator('li[data-annotator="ann"]')).to_contain_text("Overall quality: 5")
    expect(row.locator('li[data-annotator="bob"]')).to_contain_text("Overall quality: 4")
    expect(row.locator('li[data-annotator="bob"]')).to_contain_text("Problems: rambling")
    expect(page.locator("#results-table tbody tr")).to_have_count(4)
    page.check("#only-disagreements")
    expect(page.locator("#results-table tbody tr")).to_have_count(1)
    expect(page.locator("#results-table tbody tr")).to_contain_text("5+1=")
    expect(page.locator("#results-table tbody tr")).to_contain_text("disagrees")
    screenshot(page, "review-campaign-results")

    page.select_option("#register-format", "ratings_jsonl")
    page.fill("#register-name", "sums judgements")
    page.click("#register-button")
    expect(page.locator("#registered-dataset")).to_contain_text("Dataset “sums judgements”: 8 rows")
    dataset = Dataset.objects.get(source_campaign_id=campaign.pk)
    assert (dataset.name, dataset.row_count) == ("sums judgements", 8)
    page.click("#registered-dataset a")
    page.wait_for_url(f"{web_server}/registry/")
    expect(page.locator("#dataset-rows")).to_contain_text("sums judgements")
    screenshot(page, "review-registered-in-registry")


def test_pairs_are_compared_by_two_annotators_with_the_keyboard_and_export_as_preference_pairs(
    web_server, page, people, annotator_pages
):
    _, run = people
    pages = annotator_pages
    log_in(page, web_server, "rosalind")
    campaign = create_campaign_in_form(
        page,
        web_server,
        run,
        name="which sum is better",
        kind="pair",
        step=PAIR_STEP,
        extra_question=("comment", "Anything else?", {}),
    )
    assert [q["key"] for q in campaign.questions] == [BETTER, WHY]
    activate(page)
    items = {item.rollout_a.prompt: item for item in campaign.items.select_related("rollout_a", "rollout_b")}
    assert set(items) == set(PAIR_ANSWERS)

    for annotator_page in pages.values():
        start_first_open_campaign(annotator_page, web_server, campaign)
    assert_shows_nothing_about_the_run(pages["ann"], run)

    def judge(name: str, page_: Page, prompt: str) -> None:
        item = items[prompt]
        first, second = (item.rollout_b, item.rollout_a) if item.display_swap else (item.rollout_a, item.rollout_b)
        expect(page_.locator('#responses [data-label="A"] pre')).to_have_text(first.response)
        expect(page_.locator('#responses [data-label="B"] pre')).to_have_text(second.response)
        stored = PAIR_ANSWERS[prompt][name]
        as_shown = SWAPPED.get(stored, stored) if item.display_swap else stored
        page_.keyboard.press({"A": "a", "B": "b", "tie": "t"}[as_shown])
        expect(page_.locator('#questions button.choice[aria-pressed="true"]')).to_have_count(1)
        if name == "ann" and prompt == "2+3=":
            page_.keyboard.press("c")
            assert page_.evaluate("() => document.activeElement.matches('textarea.comment')")
            page_.keyboard.type(COMMENT)  # shortcut letters, typed as text
            page_.keyboard.press("Escape")
            assert focused_question(page_) == WHY
            expect(page_.locator("textarea.comment")).to_have_value(COMMENT)
            expect(page_.locator('#questions button.choice[aria-pressed="true"]')).to_have_count(1)
            screenshot(page_, "annotate-pair-item")
        press_and_wait_for_next(page_, "Enter")

    work_until_done(pages, judge)

    for judgement in Judgement.objects.filter(item__campaign=campaign).select_related("item__rollout_a", "annotator"):
        prompt, name = judgement.item.rollout_a.prompt, judgement.annotator.username
        expected = {BETTER: PAIR_ANSWERS[prompt][name]}
        if name == "ann" and prompt == "2+3=":
            expected[WHY] = COMMENT
        assert judgement.answers == expected

    open_ready(page, f"{web_server}/review/campaigns/{campaign.pk}/")
    better = page.locator(f'#agreement-table tr[data-question="{BETTER}"]')
    expect(better.locator("td.kappa")).to_have_text(shown(BETTER_KAPPA))
    expect(better.locator("td.alpha")).to_have_text(shown(BETTER_ALPHA))
    row = page.locator(f'#results-table tr[data-item="{items["4+4="].pk}"]')
    expect(row).to_contain_text("Which response is better?: B")
    split = page.locator(f'#results-table tr[data-item="{items["2+3="].pk}"]')
    expect(split.locator('li[data-annotator="ann"]')).to_contain_text(COMMENT)
    screenshot(page, "review-pair-campaign")

    expect(page.locator("#register-format")).to_have_value("trl")
    page.click("#register-button")
    expect(page.locator("#registered-dataset")).to_contain_text("2 rows")
    dataset = Dataset.objects.get(source_campaign_id=campaign.pk)
    rows = [json.loads(line) for line in Path(dataset.path).read_text().splitlines()]
    chosen = {items["1+1="].rollout_a.response, items["4+4="].rollout_b.response}
    assert {row["prompt"] for row in rows} == {"1+1=", "4+4="}
    assert {row["chosen"] for row in rows} == chosen
