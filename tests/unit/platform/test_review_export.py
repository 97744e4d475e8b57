"""Exports: preference pairs by majority in TRL's and OpenAI's formats, ratings as JSONL and CSV, and an
export registered as a registry dataset with lineage to its campaign."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from posttrain.core.errors import InvalidInput
from posttrain.review import services as review
from posttrain.review.export import campaign_export_register, export_campaign
from tests.unit.platform.helpers import (
    default_project,
    pair_campaign,
    run_with_samples,
    sample,
    shown_as,
    single_campaign,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

# Four prompt groups of two responses: (prompt, first response, second response).
GROUPS = [("2+2=", "4", "5"), ("3+3=", "6", "9"), ("1+1=", "2", "11"), ("5+5=", "10", "55")]


@pytest.fixture
def annotators(make_user):
    return [make_user("annotator", "ann"), make_user("annotator", "bob")]


@pytest.fixture
def judged_pairs(experiment, annotators):
    """Humans prefer "4" (both), split on "6"/"9", prefer "2" (both), call "10"/"55" a tie (both)."""
    samples = [
        sample(2 * g + j, 1.0 - j if g != 2 else float(j), prompt, response, group=g)
        for g, (prompt, *responses) in enumerate(GROUPS)
        for j, response in enumerate(responses)
    ]
    run = run_with_samples(experiment, {1: samples})
    campaign = pair_campaign([run], annotators, overlap=2)
    preferred = {"2+2=": ("4", "4"), "3+3=": ("6", "9"), "1+1=": ("2", "2"), "5+5=": ("tie", "tie")}
    for item in campaign.items.select_related("rollout_a", "rollout_b"):
        for user, choice in zip(annotators, preferred[item.rollout_a.prompt]):
            if choice == "tie":
                answer = "tie"
            else:
                chosen = item.rollout_a if item.rollout_a.response == choice else item.rollout_b
                answer = shown_as(item, chosen.pk)
            review.judgement_submit(item, user, {"better": answer})
    return campaign


def _positions(campaign) -> dict[str, int]:
    return {item.rollout_a.prompt: item.position for item in campaign.items.select_related("rollout_a")}


def test_trl_export_has_one_line_per_majority_preference(judged_pairs):
    by_position = sorted(_positions(judged_pairs).items(), key=lambda kv: kv[1])
    expected = {
        "2+2=": '{"prompt": "2+2=", "chosen": "4", "rejected": "5"}\n',
        "1+1=": '{"prompt": "1+1=", "chosen": "2", "rejected": "11"}\n',
    }
    exported = export_campaign(judged_pairs, "trl")
    # The split vote ("6" vs "9") and the tie give no pair.
    assert exported.lines == [expected[prompt] for prompt, _ in by_position if prompt in expected]
    assert exported.records == 2


def test_openai_export_uses_the_preference_fine_tuning_format(judged_pairs):
    lines = export_campaign(judged_pairs, "openai").lines
    assert (
        '{"input": {"messages": [{"role": "user", "content": "2+2="}]}, '
        '"preferred_output": [{"role": "assistant", "content": "4"}], '
        '"non_preferred_output": [{"role": "assistant", "content": "5"}]}\n'
    ) in lines
    assert len(lines) == 2


def test_preference_export_of_a_single_campaign_is_refused(experiment, annotators):
    run = run_with_samples(experiment, {1: [sample(0, 1.0, "2+2=", "4")]})
    campaign = single_campaign([run], annotators)
    with pytest.raises(InvalidInput) as refused:
        export_campaign(campaign, "trl")
    assert refused.value.errors[0]["loc"] == "format"


QUESTIONS = [
    {"key": "correct", "kind": "pass_fail", "label": "Correct?"},
    {"key": "stars", "kind": "rating", "label": "Stars", "min": 1, "max": 5},
    {"key": "issues", "kind": "tags", "label": "Issues", "options": ["rude", "wrong"]},
    {"key": "note", "kind": "comment", "label": "Note"},
]


@pytest.fixture
def rated(experiment, annotators):
    run = run_with_samples(experiment, {1: [sample(0, 1.0, "2+2=", "4", components={"exact": 1.0})]}, name="r")
    campaign = single_campaign([run], annotators, overlap=2, questions=QUESTIONS)
    item = campaign.items.get()
    ann, bob = annotators
    review.judgement_submit(
        item, ann, {"correct": True, "stars": 4, "issues": ["wrong", "rude"], "note": "fine, mostly"}, 12.5
    )
    review.judgement_submit(item, bob, {"correct": False, "stars": 2, "issues": []}, 3)
    return campaign, item, run


def test_ratings_jsonl_has_one_exact_line_per_judgement(rated):
    campaign, item, run = rated
    s = item.rollout_a
    lines = export_campaign(campaign, "ratings_jsonl").lines
    # The item's labels: pass/fail split 1-1 (no label), the ratings' mean 3.
    tail = '"weight": 1.0, "gold": false, "labels": {"stars": 3.0}, "label_sources": {"stars": "annotators"}, '
    tail += '"decided_by": null}\n'
    assert lines == [
        f'{{"campaign": {campaign.pk}, "item": {item.pk}, "position": 0, "annotator": "ann", "prompt": "2+2=", '
        f'"sample_a": {s.pk}, "run_a": "{run.id}", "step_a": 1, "index_a": 0, "reward_a": 1.0, '
        f'"components_a": {{"exact": 1.0}}, "response_a": "4", "sample_b": null, "run_b": null, "step_b": null, '
        f'"index_b": null, "reward_b": null, "components_b": null, "response_b": null, "answers": {{"correct": true, '
        f'"stars": 4, "issues": ["rude", "wrong"], "note": "fine, mostly"}}, "seconds": 12.5, ' + tail,
        f'{{"campaign": {campaign.pk}, "item": {item.pk}, "position": 0, "annotator": "bob", "prompt": "2+2=", '
        f'"sample_a": {s.pk}, "run_a": "{run.id}", "step_a": 1, "index_a": 0, "reward_a": 1.0, '
        f'"components_a": {{"exact": 1.0}}, "response_a": "4", "sample_b": null, "run_b": null, "step_b": null, '
        f'"index_b": null, "reward_b": null, "components_b": null, "response_b": null, "answers": {{"correct": false, '
        f'"stars": 2, "issues": []}}, "seconds": 3.0, ' + tail,
    ]


def test_ratings_csv_has_a_column_per_question(rated):
    campaign, item, run = rated
    s = item.rollout_a
    assert export_campaign(campaign, "ratings_csv").lines == [
        "campaign,item,position,annotator,prompt,sample_a,run_a,step_a,index_a,reward_a,response_a,sample_b,run_b,"
        "step_b,index_b,reward_b,response_b,seconds,weight,gold,decided_by,answer.correct,answer.stars,"
        "answer.issues,answer.note,label.stars\n",
        f"{campaign.pk},{item.pk},0,ann,2+2=,{s.pk},{run.id},1,0,1.0,4,,,,,,,12.5,1.0,false,,true,4,rude|wrong,"
        '"fine, mostly",3.0\n',
        f"{campaign.pk},{item.pk},0,bob,2+2=,{s.pk},{run.id},1,0,1.0,4,,,,,,,3.0,1.0,false,,false,2,,,3.0\n",
    ]


def test_registering_an_export_makes_a_dataset_with_lineage_to_the_campaign(judged_pairs, researcher, storage):
    dataset, created = campaign_export_register(
        judged_pairs, "trl", "human prefs", researcher, project=default_project()
    )
    content = "".join(export_campaign(judged_pairs, "trl").lines).encode()
    assert created
    assert (dataset.name, dataset.source_campaign_id, dataset.format) == ("human prefs", judged_pairs.pk, "jsonl")
    assert (dataset.row_count, dataset.columns, dataset.label_field) == (2, ["prompt", "chosen", "rejected"], "")
    assert dataset.sha256 == hashlib.sha256(content).hexdigest()
    assert Path(dataset.path).read_bytes() == content
    assert Path(dataset.path).is_relative_to(storage)
    assert not any((storage / "review" / "exports").rglob("*.jsonl"))  # the staged copy is gone
    again, created_again = campaign_export_register(
        judged_pairs, "trl", "other name", researcher, project=default_project()
    )
    assert (again.pk, created_again) == (dataset.pk, False)


def test_ratings_register_as_csv_with_one_row_per_judgement(rated, researcher):
    campaign, _, _ = rated
    dataset, _ = campaign_export_register(campaign, "ratings_csv", None, researcher, project=default_project())
    assert (dataset.format, dataset.row_count, dataset.source_campaign_id) == ("csv", 2, campaign.pk)
    assert dataset.name == "review (ratings_csv)"


def test_openai_and_empty_exports_are_not_registered(experiment, annotators, researcher):
    run = run_with_samples(experiment, {1: [sample(0, 1.0, "2+2=", "4"), sample(1, 0.0, "2+2=", "5")]})
    campaign = pair_campaign([run], annotators)
    for fmt, message in (("openai", "register trl"), ("trl", "nothing to export yet")):
        with pytest.raises(InvalidInput) as refused:
            campaign_export_register(campaign, fmt, "x", researcher, project=default_project())
        assert refused.value.errors[0]["loc"] == "format"
        assert message in refused.value.errors[0]["msg"]
