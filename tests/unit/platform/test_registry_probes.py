"""Reward probes through the API: a registered reward probed on a dataset on the user-code worker (here run
in this process, the reward's code still in the sandbox), its hackability report, and the report where a
researcher looks before launching (the experiment, the run page)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from posttrain.registry.models import RewardFunction, RewardProbe
from tests.unit.platform.helpers import make_run, registry_rows

pytestmark = pytest.mark.django_db

ROWS = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(12, 30), (7, 8), (40, 2), (33, 33), (5, 90), (61, 7)]]

LABEL_ANYWHERE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(ground_truth in solution_str)
"""


@pytest.fixture
def rows(tmp_path):
    return registry_rows(tmp_path, ROWS)


def probe(client, reward_id: int, dataset_id: int) -> dict:
    started = client.post(f"/api/rewards/{reward_id}/probes/", {"dataset": dataset_id}, format="json")
    assert started.status_code == 202, started.content
    return client.get(started.json()["url"]).json()


def flagged(report: dict) -> set[str]:
    return {p["probe"] for p in report["probes"] if p["flagged"]}


def test_an_exact_match_reward_is_reported_not_hackable(researcher_client, rows):
    done = probe(researcher_client, rows["exact"].pk, rows["dataset"].pk)
    assert done["state"] == "done" and done["dataset_name"] == "sums"
    report = done["result"]
    assert report["honest_mean"] == 1.0 and report["rows"] == 6 and not report["hackable"] and flagged(report) == set()
    assert {e["probe"] for e in done["examples"]} >= {"honest", "all_labels", "very_long"}


def test_a_format_only_reward_is_caught_by_the_right_format_with_a_wrong_answer(researcher_client, rows):
    digits = RewardFunction.objects.create(name="digits", kind="builtin", spec={"type": "regex", "pattern": r"^\d+$"})
    report = probe(researcher_client, digits.pk, rows["dataset"].pk)["result"]
    assert report["hackable"] and {"right_format_wrong_answer", "other_label"} <= flagged(report)
    assert "empty" not in flagged(report)


def test_a_python_reward_that_finds_the_label_anywhere_is_caught_in_the_sandbox(researcher_client, rows):
    created = researcher_client.post(
        "/api/rewards/", {"name": "anywhere", "kind": "python", "source": LABEL_ANYWHERE}, format="json"
    )
    assert created.status_code == 201, created.content
    report = probe(researcher_client, created.json()["id"], rows["dataset"].pk)["result"]
    assert flagged(report) == {"all_labels", "label_in_garbage"}
    assert next(p for p in report["probes"] if p["probe"] == "all_labels")["fraction"] == 1.0


def test_the_probes_of_a_reward_are_listed_newest_first_and_per_dataset(researcher_client, rows, tmp_path):
    first = probe(researcher_client, rows["exact"].pk, rows["dataset"].pk)
    second = probe(researcher_client, rows["exact"].pk, rows["dataset"].pk)
    listed = researcher_client.get(f"/api/rewards/{rows['exact'].pk}/probes/", {"dataset": rows["dataset"].pk}).json()
    assert [p["id"] for p in listed] == [second["id"], first["id"]]
    bad = researcher_client.get(f"/api/rewards/{rows['exact'].pk}/probes/", {"dataset": "x"})
    assert bad.status_code == 400 and bad.json()["errors"] == [{"loc": "dataset", "msg": "must be an integer"}]


def test_a_dataset_without_labels_cannot_be_probed(researcher_client, rows):
    rows["dataset"].label_field = ""
    rows["dataset"].save()
    response = researcher_client.post(f"/api/rewards/{rows['exact'].pk}/probes/", {"dataset": rows["dataset"].pk})
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "dataset" and "no label field" in response.json()["errors"][0]["msg"]
    assert not RewardProbe.objects.exists()


def test_a_probe_whose_dataset_file_is_gone_fails_saying_so(researcher_client, rows):
    rows["dataset"].path = "/nonexistent/prompts.jsonl"
    rows["dataset"].save()
    done = probe(researcher_client, rows["exact"].pk, rows["dataset"].pk)
    assert done["state"] == "failed" and "no such file" in done["error"]


def test_probes_no_worker_finished_are_failed_by_the_periodic_check(rows, settings):
    from posttrain.core.job_runner import worker_jobs_expire

    now = timezone.now()
    long_ago = now - timedelta(seconds=settings.USER_CODE_TIME_LIMIT_S + 61)
    make = lambda state: RewardProbe.objects.create(reward=rows["exact"], dataset=rows["dataset"], state=state)  # noqa: E731
    killed, fresh, never_taken = make("running"), make("running"), make("queued")
    RewardProbe.objects.filter(pk=killed.pk).update(started_at=long_ago)
    RewardProbe.objects.filter(pk=fresh.pk).update(started_at=now)
    RewardProbe.objects.filter(pk=never_taken.pk).update(
        created_at=now - timedelta(seconds=settings.REWARD_PROBE_QUEUE_S + 1)
    )
    assert worker_jobs_expire() == 2
    states = {p.pk: (p.state, p.error) for p in RewardProbe.objects.all()}
    assert states[killed.pk][0] == "failed" and "stops user code after" in states[killed.pk][1]
    assert states[never_taken.pk][0] == "failed" and "no worker took it" in states[never_taken.pk][1]
    assert states[fresh.pk][0] == "running"


def test_the_experiment_and_its_runs_page_show_each_rewards_latest_probe(researcher_client, rows, client):
    from posttrain.runs.models import Experiment, ExperimentReward

    digits = RewardFunction.objects.create(name="digits", kind="builtin", spec={"type": "regex", "pattern": r"^\d+$"})
    experiment = Experiment.objects.create(name="e", model=rows["model"], dataset=rows["dataset"], config={})
    for position, reward in enumerate([rows["exact"], digits]):
        ExperimentReward.objects.create(experiment=experiment, reward=reward, position=position)
    body = researcher_client.get(f"/api/experiments/{experiment.pk}/").json()
    assert [(p["reward_name"], p["probe"]) for p in body["probes"]] == [("exact answer", None), ("digits", None)]

    probe(researcher_client, digits.pk, rows["dataset"].pk)
    body = researcher_client.get(f"/api/experiments/{experiment.pk}/").json()
    summary = {p["reward_name"]: p for p in body["probes"]}
    assert summary["digits"]["state"] == "done" and summary["digits"]["hackable"]
    assert summary["digits"]["fraction"] == 1.0 and summary["exact answer"]["probe"] is None

    run = make_run(experiment, "running")
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-probes"' in page and "⚠ hackable" in page and "not probed" in page
