"""The review API: campaign management for researchers, the queue for annotators (and what a blind item
hides), results next to the rewards, agreement figures, export and registration."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.support.openapi import assert_documented
from tests.unit.platform.helpers import run_with_samples, sample

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

CAMPAIGNS = "/api/review/campaigns/"
PASS_FAIL = [{"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?"}]
PREFERENCE = [
    {"key": "better", "kind": "pairwise", "label": "Which is better?"},
    {"key": "note", "kind": "comment", "label": "Why?"},
]


@pytest.fixture
def users(make_user):
    return {name: make_user("annotator", name) for name in ("ann", "bob", "eve")}


@pytest.fixture
def clients(users) -> dict[str, APIClient]:
    made = {}
    for name, user in users.items():
        made[name] = APIClient()
        made[name].force_login(user)
    return made


@pytest.fixture
def run(experiment):
    """Four prompts at step 1; rewards 1, 0, 1, 0 (the responses "4" and "9" are right, "7" and "3" wrong)."""
    return run_with_samples(
        experiment,
        {
            1: [
                sample(0, 1.0, "2+2=", "4", group=0),
                sample(1, 0.0, "3+4=", "7x", group=1),
                sample(2, 1.0, "1+8=", "9", group=2),
                sample(3, 0.0, "1+2=", "3x", group=3),
            ]
        },
        name="secret-run-name",
    )


def create(client: APIClient, run, **fields):
    body = {
        "name": "check answers",
        "instructions": "Pass if the answer is right.",
        "kind": "single",
        "questions": PASS_FAIL,
        "source": {"runs": [str(run.id)], "rule": "random", "k": 10, "seed": 1},
        "overlap": 2,
        "annotators": ["ann", "bob"],
        **fields,
    }
    return client.post(CAMPAIGNS, body, format="json")


def active(client: APIClient, run, **fields) -> dict:
    response = create(client, run, **fields)
    assert response.status_code == 201, response.content
    activated = client.post(f"{CAMPAIGNS}{response.json()['id']}/activate/")
    assert activated.status_code == 200
    return activated.json()


def _keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


# --- researchers ------------------------------------------------------------------------------


def test_a_researcher_creates_a_draft_campaign_with_its_items(researcher_client, run, users):
    response = create(researcher_client, run)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["kind"], body["blind"], body["overlap"], body["item_count"]) == (
        "draft",
        "single",
        True,
        2,
        4,
    )
    assert body["annotators"] == ["ann", "bob"]
    assert body["questions"] == [
        {"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?", "required": True, "help": ""}
    ]
    assert body["progress"]["judgements_needed"] == 8
    items = researcher_client.get(f"{CAMPAIGNS}{body['id']}/items/").json()
    assert items["count"] == 4
    first = items["results"][0]
    assert_documented(items, "/api/review/campaigns/{id}/items/")  # every field documented, none more
    assert first["rollout_a"]["run_name"] == "secret-run-name"
    listed = researcher_client.get(CAMPAIGNS, {"state": "draft"}).json()
    assert [c["id"] for c in listed["results"]] == [body["id"]]


def test_bad_campaign_fields_come_back_naming_each_field(researcher_client, run, users):
    response = create(
        researcher_client,
        run,
        questions=[{"key": "stars", "kind": "rating", "label": "Stars", "min": 5, "max": 1}],
        source={"runs": [str(run.id)], "rule": "median"},
        annotators=["ann", "nobody"],
    )
    assert response.status_code == 400
    locs = {e["loc"] for e in response.json()["errors"]}
    assert "annotators" in locs  # an unknown username, from the serializer
    response = create(
        researcher_client,
        run,
        questions=[{"key": "stars", "kind": "rating", "label": "Stars", "min": 5, "max": 1}],
        source={"runs": [str(run.id)], "rule": "median"},
    )
    assert {e["loc"] for e in response.json()["errors"]} == {"questions[0].max", "source.rule"}


def test_a_researcher_activates_edits_and_closes_a_campaign(researcher_client, run, users):
    campaign = create(researcher_client, run).json()
    url = f"{CAMPAIGNS}{campaign['id']}/"
    edited = researcher_client.patch(url, {"name": "renamed", "annotators": ["ann", "bob", "eve"]}, format="json")
    assert edited.status_code == 200 and edited.json()["annotators"] == ["ann", "bob", "eve"]
    assert researcher_client.post(f"{url}activate/").json()["state"] == "active"
    assert researcher_client.post(f"{url}close/").json()["state"] == "closed"
    again = researcher_client.post(f"{url}close/")
    assert again.status_code == 409
    assert again.json() == {"errors": [{"loc": "", "msg": "cannot close a campaign that is closed"}], "state": "closed"}


# --- annotators -------------------------------------------------------------------------------


def test_a_blind_item_shows_no_reward_run_step_or_sample(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    response = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"campaign", "item", "progress"}
    assert body["campaign"] == {
        "id": campaign["id"],
        "name": "check answers",
        "kind": "single",
        "blind": True,
        "instructions": "Pass if the answer is right.",
        "instructions_html": "<p>Pass if the answer is right.</p>\n",
        "questions": [{**q, "help_html": "", "rubric_html": []} for q in campaign["questions"]],
    }
    item = body["item"]
    assert_documented(body, "/api/review/campaigns/{id}/next/", "post")  # every field documented, none more
    assert item["suggestion"] is None  # no judge ran, and the campaign does not show suggestions
    assert [set(r) for r in item["responses"]] == [{"label", "text", "steps"}]
    text = response.content.decode()
    assert not _keys(body) & {"reward", "components", "run", "run_name", "step", "sample", "judgements"}
    assert str(run.id) not in text and "secret-run-name" not in text


def test_an_open_item_shows_the_samples_reward_and_run(researcher_client, clients, run):
    campaign = active(researcher_client, run, blind=False)
    item = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
    facts = item["responses"][0]["sample"]
    assert facts["run"] == str(run.id) and facts["run_name"] == "secret-run-name" and facts["step"] == 1
    assert facts["reward"] in (0.0, 1.0)


def test_an_annotator_never_sees_the_other_annotators_answers(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    next_url = f"{CAMPAIGNS}{campaign['id']}/next/"
    bobs = clients["bob"].post(next_url).json()["item"]
    clients["bob"].post(f"/api/review/items/{bobs['id']}/judgement/", {"answers": {"correct": False}}, format="json")
    seen = []
    while (response := clients["ann"].post(next_url)).status_code == 200:
        item = response.json()["item"]
        seen.append(item["id"])
        assert item["my_answers"] is None and not _keys(response.json()) & {"judgements", "answers"}
        clients["ann"].post(f"/api/review/items/{item['id']}/judgement/", {"answers": {"correct": True}}, format="json")
    assert bobs["id"] in seen and len(seen) == 4


def test_an_annotator_works_the_queue_one_request_per_item(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    queue = clients["ann"].get("/api/review/queue/").json()
    assert [(c["id"], c["progress"]["remaining"], c["progress"]["done"]) for c in queue] == [(campaign["id"], 4, False)]
    item = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
    judged = []
    while item is not None:
        response = clients["ann"].post(
            f"/api/review/items/{item['id']}/judgement/",
            {"answers": {"correct": True}, "seconds": 2.5, "claim_next": True},
            format="json",
        )
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["judgement"]["answers"] == {"correct": True} and body["created"] is True
        judged.append(item["id"])
        item = body["next"] and body["next"]["item"]
    assert len(set(judged)) == 4
    assert body["progress"] == {
        "judged": 4,
        "remaining": 0,
        "available": 0,
        "skipped": 0,
        "held_item": None,
        "done": True,
    }
    assert clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").status_code == 204


def test_skip_moves_on_and_release_gives_the_item_back(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    first = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
    skipped = clients["ann"].post(f"/api/review/items/{first['id']}/skip/", {"claim_next": True}, format="json").json()
    assert skipped["skipped"] is True and skipped["progress"]["skipped"] == 1
    second = skipped["next"]["item"]
    assert second["id"] != first["id"]
    assert clients["ann"].post(f"/api/review/items/{second['id']}/release/").json() == {"released": True}
    assert clients["ann"].post(f"/api/review/items/{second['id']}/release/").json() == {"released": False}


def test_bad_answers_name_the_question(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    item = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
    response = clients["ann"].post(
        f"/api/review/items/{item['id']}/judgement/", {"answers": {"correct": "maybe"}}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"errors": [{"loc": "answers.correct", "msg": "must be true (pass) or false (fail)"}]}


def test_an_unassigned_annotator_cannot_reach_the_campaign_or_its_items(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    item = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
    eve = clients["eve"]
    assert eve.get("/api/review/queue/").json() == []
    assert eve.post(f"{CAMPAIGNS}{campaign['id']}/next/").status_code == 404
    for action in ("judgement", "skip", "release"):
        response = eve.post(f"/api/review/items/{item['id']}/{action}/", {"answers": {"correct": True}}, format="json")
        assert response.status_code == 404, action


def test_annotators_are_refused_on_researcher_endpoints(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    for url in (
        CAMPAIGNS,
        f"{CAMPAIGNS}{campaign['id']}/",
        f"{CAMPAIGNS}{campaign['id']}/results/",
        f"{CAMPAIGNS}{campaign['id']}/agreement/",
        f"{CAMPAIGNS}{campaign['id']}/export/?format=trl",
    ):
        assert clients["ann"].get(url).status_code == 403, url


# --- results, agreement, export ---------------------------------------------------------------


def _judge_all(clients, campaign_id: int, verdicts: dict[str, dict[str, bool]]) -> None:
    """verdicts: annotator → response text → pass/fail."""
    for name, by_response in verdicts.items():
        while (response := clients[name].post(f"{CAMPAIGNS}{campaign_id}/next/")).status_code == 200:
            item = response.json()["item"]
            answer = by_response[item["responses"][0]["text"]]
            clients[name].post(
                f"/api/review/items/{item['id']}/judgement/", {"answers": {"correct": answer}}, format="json"
            )


def test_agreement_equals_the_hand_computed_figures(researcher_client, clients, run):
    """Items (ann, bob): "4" (T, T), "7x" (T, F), "9" (F, F), "3x" (F, F) — the table of
    test_review_agreement.test_pass_fail_question_gets_kappa_and_alpha_of_its_two_annotators:
    kappa = 0.5, alpha = 16/30."""
    campaign = active(researcher_client, run)
    _judge_all(
        clients,
        campaign["id"],
        {
            "ann": {"4": True, "7x": True, "9": False, "3x": False},
            "bob": {"4": True, "7x": False, "9": False, "3x": False},
        },
    )
    body = researcher_client.get(f"{CAMPAIGNS}{campaign['id']}/agreement/").json()
    (question,) = body["questions"]
    assert (question["key"], question["metric"], question["items"]) == ("correct", "nominal", 4)
    assert question["kappa"] == pytest.approx(0.5, abs=1e-9)
    assert question["alpha"] == pytest.approx(16 / 30, abs=1e-9)
    assert body["annotators"] == ["ann", "bob"] and body["judgements"] == 8
    stats = {s["annotator"]: s for s in body["annotator_stats"]}
    assert stats["ann"]["questions"]["correct"]["pass_rate"] == 0.5
    assert stats["bob"]["questions"]["correct"]["agreement_with_majority"] == {"rate": 0.75, "items": 4}


def test_results_flag_where_humans_and_the_reward_disagree(researcher_client, clients, run):
    campaign = active(researcher_client, run)
    # Humans pass "9" (reward 1) and "4" (reward 1) but also "3x" (reward 0) — and fail "7x" (reward 0).
    verdicts = {"4": True, "7x": False, "9": True, "3x": True}
    _judge_all(clients, campaign["id"], {"ann": verdicts, "bob": verdicts})
    url = f"{CAMPAIGNS}{campaign['id']}/results/"
    rows = researcher_client.get(url, {"ordering": "-disagreement"}).json()["results"]
    top = rows[0]
    assert top["samples"]["A"]["response"] == "3x" and top["disagrees"] is True
    assert (top["human_score"], top["reward_rank"]) == (1.0, pytest.approx(1 / 6))  # rewards 0,0,1,1: ranks ½/3, 2½/3
    assert top["summary"]["correct"] == {"n": 2, "pass_rate": 1.0}
    assert [j["annotator"] for j in top["judgements"]] == ["ann", "bob"]
    only = researcher_client.get(url, {"disagrees": "true"}).json()
    assert [r["samples"]["A"]["response"] for r in only["results"]] == ["3x"]
    assert researcher_client.get(url, {"ordering": "chaos"}).status_code == 400


def test_pair_results_compare_the_rewards_choice_with_the_humans(researcher_client, clients, experiment):
    run = run_with_samples(experiment, {1: [sample(0, 1.0, "2+2=", "5"), sample(1, 0.0, "2+2=", "4")]})
    campaign = active(researcher_client, run, kind="pair", questions=PREFERENCE, overlap=1)
    item = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
    right = next(r["label"] for r in item["responses"] if r["text"] == "4")
    clients["ann"].post(
        f"/api/review/items/{item['id']}/judgement/",
        {"answers": {"better": right, "note": "5 is wrong"}},
        format="json",
    )
    (row,) = researcher_client.get(f"{CAMPAIGNS}{campaign['id']}/results/").json()["results"]
    human = row["human_preferred"]
    assert row["samples"][human]["response"] == "4"
    assert row["samples"][row["reward_preferred"]]["response"] == "5"
    assert row["disagrees"] is True


def test_export_downloads_and_registers_as_a_dataset(researcher_client, clients, experiment):
    run = run_with_samples(experiment, {1: [sample(0, 1.0, "2+2=", "5"), sample(1, 0.0, "2+2=", "4")]})
    campaign = active(researcher_client, run, kind="pair", questions=PREFERENCE, overlap=1)
    item = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
    right = next(r["label"] for r in item["responses"] if r["text"] == "4")
    clients["ann"].post(f"/api/review/items/{item['id']}/judgement/", {"answers": {"better": right}}, format="json")
    url = f"{CAMPAIGNS}{campaign['id']}/export/"
    download = researcher_client.get(url, {"format": "trl"})
    assert download.status_code == 200
    assert download["Content-Type"] == "application/x-ndjson"
    assert download["Content-Disposition"] == f'attachment; filename="campaign-{campaign["id"]}-trl.jsonl"'
    assert download.content.decode() == '{"prompt": "2+2=", "chosen": "4", "rejected": "5"}\n'
    csv = researcher_client.get(url, {"format": "ratings_csv"})
    assert csv["Content-Type"].startswith("text/csv") and csv.content.decode().count("\n") == 2
    wrong = researcher_client.get(url, {"format": "xlsx"})
    assert wrong.status_code == 400 and wrong.json()["errors"][0]["loc"] == "format"
    registered = researcher_client.post(f"{url}register/", {"format": "trl", "name": "math prefs"}, format="json")
    assert registered.status_code == 201, registered.content
    dataset = registered.json()
    assert (dataset["name"], dataset["source_campaign_id"], dataset["row_count"]) == ("math prefs", campaign["id"], 1)
    assert researcher_client.get(f"/api/datasets/{dataset['id']}/").json()["source_campaign_id"] == campaign["id"]
    again = researcher_client.post(f"{url}register/", {"format": "trl"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == dataset["id"]
    refused = researcher_client.post(f"{url}register/", {"format": "openai"}, format="json")
    assert refused.status_code == 400 and refused.json()["errors"][0]["loc"] == "format"


def test_the_annotator_list_offers_only_annotators(researcher_client, users, make_user):
    make_user("researcher", "rita")
    assert [u["username"] for u in researcher_client.get("/api/review/annotators/").json()] == ["ann", "bob", "eve"]


def test_a_multi_turn_episode_reaches_the_annotator_turn_by_turn_its_rewards_hidden_when_blind(
    researcher_client, clients, experiment
):
    turns = [
        {"role": "assistant", "text": "[5]", "reward": None},
        {"role": "environment", "text": "higher", "reward": 0.0},
        {"role": "assistant", "text": "[9]", "reward": None},
        {"role": "environment", "text": "", "reward": 1.0},
    ]
    episode = run_with_samples(experiment, {1: [sample(0, 1.0, "guess 1-10:", "[5]higher[9]", turns=turns)]})
    for blind in (False, True):
        campaign = active(researcher_client, episode, name=f"episodes {blind}", blind=blind, overlap=1)
        item = clients["ann"].post(f"{CAMPAIGNS}{campaign['id']}/next/").json()["item"]
        shown = item["responses"][0]["turns"]
        assert [(t["role"], t["text"]) for t in shown] == [(t["role"], t["text"]) for t in turns]
        assert [t["reward"] for t in shown] == ([None] * 4 if blind else [None, 0.0, None, 1.0])
        clients["ann"].post(f"/api/review/items/{item['id']}/release/")
