"""The per-token view of a sample: stored with the samples event as the engine packs it, checked field by
field at ingestion, read back with the same prompt's responses across steps (the dialog's step slider)."""

from __future__ import annotations

import pytest

from posttrain.runs import services
from posttrain.runs.models import RunState
from rl_engine.token_view import pack_f16, token_view, unpack_f16
from tests.unit.platform.helpers import event, make_run, post_events, sample_record

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]

VIEW = token_view(
    ["4", "2", "<eos>"],
    {"rollout_logprob": [-0.5, -2.0, -0.25], "trainer_logprob": [-0.5, -1.0, -0.25], "advantage": [0.5] * 3},
)


@pytest.fixture
def run(experiment):
    run = make_run(experiment, RunState.RUNNING)
    events = [
        event(
            run,
            step,
            "samples",
            step,
            {"samples": [sample_record(i, tokens=VIEW, versions=[[step - 1, 3]]) for i in range(2)]},
        )
        for step in (1, 2)
    ]
    services.events_ingest(run.id, events)
    return run


def test_a_samples_view_comes_back_with_the_same_prompts_responses_at_every_step(api, run):
    response = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 2, "index": 1})
    assert response.status_code == 200
    body = response.json()
    assert body["tokens"]["text"] == ["4", "2", "<eos>"]
    assert unpack_f16(body["tokens"]["trainer_logprob"]) == [-0.5, -1.0, -0.25]
    assert body["tokens"]["versions"] == [[1, 3]]
    # sample_record(1) has the prompt "1+1=" at both steps.
    assert body["same_prompt"] == [{"step": 1, "index": 1}, {"step": 2, "index": 1}]


def test_a_missing_sample_or_parameter_is_answered_in_the_error_contract(api, run):
    missing = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 9, "index": 0})
    assert missing.status_code == 404 and "no sample 0 at step 9" in missing.json()["errors"][0]["msg"]
    bad = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 1})
    assert bad.status_code == 400 and bad.json()["errors"] == [{"loc": "index", "msg": "required"}]


def test_a_view_whose_arrays_do_not_match_its_tokens_is_refused_naming_the_field(client, experiment):
    run = make_run(experiment, RunState.RUNNING)
    short = {**VIEW, "entropy": pack_f16([1.0])}
    response = post_events(client, run, [event(run, 1, "samples", 1, {"samples": [sample_record(0, tokens=short)]})])
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "events[0].data.samples[0].tokens.entropy"
