"""Fixtures and helpers of the runs tests (imported by the test_runs_* modules).

Registry objects are created directly with the ORM (the registry's own services are tested there):
a model folder that exists, a stored JSONL dataset, rewards with engine reward specs."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
from posttrain.runs import services
from posttrain.runs.models import Run, RunState
from posttrain.runs.tokens import ingest_token

BASE_CONFIG: dict[str, Any] = {
    "algorithm": {"name": "grpo"},
    "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
    "train": {"steps": 2, "micro_batch_size": 4},
    "logging": {"eval_every": 0, "heartbeat_s": 2},
}


def a_researcher(username: str = "ada"):
    """A user with the researcher role (the accounts app's groups), so the runs API admits them."""
    try:
        from posttrain.accounts.services import user_create
    except ImportError:  # roles not there yet: any signed-in user
        return get_user_model().objects.create_user(username=username, password="a-long-passphrase")
    return user_create(username, "a-long-passphrase", "researcher")


@pytest.fixture
def researcher(db):
    return a_researcher()


@pytest.fixture
def api(client, researcher):
    client.force_login(researcher)
    return client


@pytest.fixture
def storage(settings, tmp_path) -> Path:
    settings.STORAGE_ROOT = tmp_path / "storage"
    return settings.STORAGE_ROOT


@pytest.fixture
def registry(db, tmp_path) -> dict[str, Any]:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    return {
        "model": ModelAsset.objects.create(name="tiny", path=str(model_dir)),
        "dataset": Dataset.objects.create(
            name="sums",
            sha256="a" * 64,
            format="jsonl",
            path=str(data),
            size_bytes=data.stat().st_size,
            row_count=8,
            prompt_field="question",
            label_field="answer",
            columns=["question", "answer"],
        ),
        "exact": RewardFunction.objects.create(name="exact answer", kind="builtin", spec={"type": "exact_match"}),
        "format": RewardFunction.objects.create(
            name="two-digits", kind="builtin", spec={"type": "regex", "pattern": r"^\d\d"}
        ),
    }


def create_body(registry, **overrides) -> dict:
    """A POST /api/experiments/ body over the `registry` fixture's objects."""
    body = {
        "name": "sums grpo",
        "model": registry["model"].pk,
        "dataset": registry["dataset"].pk,
        "rewards": [{"reward": registry["exact"].pk, "weight": 1.0}, {"reward": registry["format"].pk, "weight": 0.5}],
        "config": BASE_CONFIG,
    }
    body.update(overrides)
    return body


def post(api, url: str, body) -> object:
    return api.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def experiment(registry, researcher):
    return services.experiment_create(
        name="sums grpo",
        model=registry["model"],
        dataset=registry["dataset"],
        rewards=[(registry["exact"], 1.0), (registry["format"], 0.5)],
        config=BASE_CONFIG,
        user=researcher,
    )


@pytest.fixture
def no_dispatch(monkeypatch) -> list[tuple[str, str]]:
    """Records the Celery tasks services would send (after commit) instead of sending them."""
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(services.launch, "_dispatch", lambda name, run_id: sent.append((name, str(run_id))))
    return sent


def make_run(experiment, state: str = RunState.QUEUED, **fields) -> Run:
    """A run in any state, as the services would have left it."""
    run = services.run_launch(experiment)
    if state != RunState.QUEUED or fields:
        Run.objects.filter(pk=run.pk).update(state=state, **fields)
        run.refresh_from_db()
    return run


def auth(run: Run) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {ingest_token(run.id)}"}


def event(run: Run, seq: int, type: str = "heartbeat", step: int | None = None, data: dict | None = None) -> dict:
    return {"run": str(run.id), "seq": seq, "type": type, "step": step, "time": time.time(), "data": data or {}}


def sample_record(index: int, reward: float = 1.0, **overrides) -> dict:
    record = {
        "index": index,
        "group": index // 2,
        "prompt": f"{index}+1=",
        "response": str(index + 1),
        "label": str(index + 1),
        "reward": reward,
        "components": {"exact_answer": reward},
        "advantage": 0.5,
        "length": 2,
        "finish_reason": "stop",
        "errors": [],
        "kept": True,
    }
    record.update(overrides)
    return record


def post_events(client, run: Run, events: list[dict], headers: dict | None = None, slash: bool = True):
    url = f"/api/runs/{run.id}/events" + ("/" if slash else "")
    return client.post(
        url,
        data=json.dumps({"events": events}),
        content_type="application/json",
        **(auth(run) if headers is None else headers),
    )


class FakeJobs:
    """Ray's Jobs API as the services see it: a dict of job statuses and logs."""

    def __init__(self) -> None:
        self.statuses: dict[str, str] = {}
        self.job_logs: dict[str, str] = {}
        self.exit_codes: dict[str, int] = {}
        self.submitted: list[str] = []
        self.stopped: list[str] = []
        self.fail_submit: Exception | None = None
        self.stop_sets: str | None = "STOPPED"

    def submit(self, run: Run) -> str:
        if self.fail_submit is not None:
            raise self.fail_submit
        self.submitted.append(str(run.id))
        self.statuses.setdefault(str(run.id), "PENDING")
        return str(run.id)

    def stop(self, run: Run) -> bool:
        self.stopped.append(str(run.id))
        if str(run.id) not in self.statuses:
            return False
        if self.stop_sets:
            self.statuses[str(run.id)] = self.stop_sets
        return True

    def status(self, run: Run) -> str | None:
        return self.statuses.get(str(run.id))

    def logs(self, run: Run) -> str:
        return self.job_logs.get(str(run.id), "")

    def exit_code(self, run: Run) -> int | None:
        return self.exit_codes.get(str(run.id))


def unknown_run_id() -> str:
    return str(uuid.uuid4())
