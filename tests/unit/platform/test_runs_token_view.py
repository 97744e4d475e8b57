"""The per-token view of a sample: stored in the step's rollout file (token pieces and float32 arrays), read
back as the dialog reads it (base64 float16) with the same prompt's responses across steps (the dialog's
step slider)."""

from __future__ import annotations

import math

import pytest

from posttrain.runs.models import RunState
from posttrain.telemetry.ingestion import events_ingest
from posttrain.telemetry.rollouts import MAX_VIEW_TOKENS, pack_f16, packed_view
from tests.unit.platform.helpers import make_run, sample_record, samples_event, unpack_f16

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]

VIEW = {
    "token_text": ["4", "2", "<eos>"],
    "token_ids": [7, 8, 2],
    "rollout_logprob": [-0.5, -2.0, -0.25],
    "trainer_logprob": [-0.5, -1.0, -0.25],
    "token_advantage": [0.5] * 3,
}


@pytest.fixture
def run(experiment):
    run = make_run(experiment, RunState.RUNNING)
    events = [
        samples_event(run, step, step, [sample_record(i, versions=[[step - 1, 3]], **VIEW) for i in range(2)])
        for step in (1, 2)
    ]
    events_ingest(run.id, events)
    return run


def test_a_samples_view_comes_back_with_the_same_prompts_responses_at_every_step(api, run):
    response = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 2, "index": 1})
    assert response.status_code == 200
    body = response.json()
    assert body["tokens"]["text"] == ["4", "2", "<eos>"]
    assert unpack_f16(body["tokens"]["trainer_logprob"]) == [-0.5, -1.0, -0.25]
    assert unpack_f16(body["tokens"]["advantage"]) == [0.5] * 3
    assert "entropy" not in body["tokens"]  # not recorded: left out, as the engine would
    assert body["tokens"]["versions"] == [[1, 3]]
    # sample_record(1) has the prompt "1+1=" at both steps.
    assert body["same_prompt"] == [{"step": 1, "index": 1}, {"step": 2, "index": 1}]


def test_a_missing_sample_or_parameter_is_answered_in_the_error_contract(api, run):
    missing = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 9, "index": 0})
    assert missing.status_code == 404 and "no rollout 0 at step 9" in missing.json()["errors"][0]["msg"]
    bad = api.get(f"/api/runs/{run.id}/sample-tokens/", {"step": 1})
    assert bad.status_code == 400 and bad.json()["errors"] == [{"loc": "index", "msg": "required"}]


def test_packed_values_come_back_at_float16_precision():
    values = [-0.6931, -12.25, 0.0, 3.5, -math.inf, None]
    packed = pack_f16(values)
    assert packed is not None and len(packed) == math.ceil(2 * len(values) / 3) * 4  # 2 bytes a value, base64
    back = unpack_f16(packed)
    assert back[1:5] == [-12.25, 0.0, 3.5, -math.inf] and math.isnan(back[5])  # a missing value: NaN
    assert back[0] == pytest.approx(-0.6931, abs=5e-4)


def test_a_view_packs_the_columns_it_has_and_is_bounded():
    long = MAX_VIEW_TOKENS + 5
    view = packed_view({"token_text": ["x"] * long, "token_advantage": [1.0] * long, "entropy": None})
    assert set(view) == {"text", "advantage", "truncated"}  # the file's token_advantage is the dialog's advantage
    assert len(view["text"]) == MAX_VIEW_TOKENS == len(unpack_f16(view["advantage"]))
    assert view["truncated"] == {"token_text": long}  # what the dialog says it shows the first of
    assert "truncated" not in packed_view({"token_text": ["x"], "token_advantage": [1.0]})
    assert packed_view({"token_text": None, "token_advantage": None}) == {}  # a step that recorded none
