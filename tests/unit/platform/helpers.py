"""Helpers of the platform tests that are not fixtures (the fixtures are in tests/conftest.py and this
folder's conftest.py): rows made straight through the ORM, event and sample records, a fake Ray Jobs
client, a fake cluster view for admission, review campaigns, and every /api/ endpoint for the permission
matrix.

Registry rows come from the ORM, not the registry's services (tested on their own): a model folder that
exists, a stored JSONL dataset, rewards with engine reward specs."""

from __future__ import annotations

import json
import re
import struct
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

from posttrain.accounts.services import user_create
from posttrain.core.run_tokens import ingest_token
from posttrain.review import services as review
from posttrain.review.models import Campaign, ReviewItem
from posttrain.runs import services
from posttrain.runs.models import Run, RunState, RunTransition
from posttrain.scheduling.models import ClusterSnapshot
from posttrain.scheduling.rules import ClusterNode, ClusterView
from posttrain.telemetry.ingestion import events_ingest

PASSWORD = "a-long-test-passphrase"  # every platform test user's password


# --- users, experiments and runs -------------------------------------------------------------------


BASE_CONFIG: dict[str, Any] = {
    "algorithm": {"name": "grpo"},
    "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
    "train": {"steps": 2, "micro_batch_size": 4},
    "logging": {"eval_every": 0, "heartbeat_s": 2},
}


def default_project() -> Any:
    """The project rows land in when nothing names one (as every row made before projects did)."""
    from posttrain.projects.models import Project, default_project_id

    return Project.objects.get(pk=default_project_id())


def join(user: Any, role: str = "member", project: Any = None) -> Any:
    """Make `user` a member of `project` (default: the default project) with `role`."""
    from posttrain.projects.access import forget_cached_project_roles
    from posttrain.projects.models import Membership

    Membership.objects.update_or_create(project=project or default_project(), user=user, defaults={"role": role})
    forget_cached_project_roles(user)
    return user


def a_campaign_owner() -> Any:
    """The researcher who makes the tests' campaigns when the test does not say who: a maintainer of the default
    project, so she reads every run there."""
    from django.contrib.auth import get_user_model

    found = get_user_model().objects.filter(username="campaign-owner").first()
    return found or a_researcher("campaign-owner", role="maintainer")


def a_researcher(username: str = "ada", role: str = "member") -> Any:
    """A user with the researcher role, password PASSWORD, with `role` in the default project (where the rows of
    most tests are)."""
    return join(user_create(username, PASSWORD, "researcher"), role)


def grant_server_paths(user: Any) -> Any:
    """What an admin grants a researcher who registers files on the server (`manage.py grant_server_paths`)."""
    from posttrain.accounts.services import user_set_server_paths

    return user_set_server_paths(user, True)


def registry_rows(folder: Path, rows: list[tuple[str, str]], sha256: str = "a" * 64) -> dict[str, Any]:
    """Registry rows straight through the ORM (the registry's services are tested on their own): "model", a
    model folder that exists; "dataset", a stored JSONL dataset of (question, answer) `rows`; "exact", an
    exact-match reward."""
    from posttrain.registry.models import Dataset, ModelAsset, RewardFunction

    model_dir = folder / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    data = folder / "prompts.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    return {
        "model": ModelAsset.objects.create(name="tiny", path=str(model_dir)),
        "dataset": Dataset.objects.create(
            name="sums",
            sha256=sha256,
            format="jsonl",
            path=str(data),
            size_bytes=data.stat().st_size,
            row_count=len(rows),
            prompt_field="question",
            label_field="answer",
            columns=["question", "answer"],
        ),
        "exact": RewardFunction.objects.create(name="exact answer", kind="builtin", spec={"type": "exact_match"}),
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


def make_run(experiment, state: str = RunState.QUEUED, **fields) -> Run:
    """A run in any state, as the services would have left it."""
    run = services.run_launch(experiment)
    if state != RunState.QUEUED or fields:
        Run.objects.filter(pk=run.pk).update(state=state, **fields)
        run.refresh_from_db()
    return run


def a_full_one_cpu_cluster(taken_at: datetime) -> ClusterSnapshot:
    """The one cluster snapshot row: a single head node with 1 CPU, all of it taken. Set, not added: a live
    stack's admission pass may already have made the row (get_or_create)."""
    node = {"node_id": "n0", "address": "10.0.0.1", "head": True, "total": {"CPU": 1, "GPU": 0}}
    snapshot, _ = ClusterSnapshot.objects.update_or_create(
        pk=1,
        defaults={
            "nodes": [{**node, "free": {"CPU": 0, "GPU": 0}}],
            "total": {"CPU": 1, "GPU": 0},
            "free": {"CPU": 0, "GPU": 0},
            "taken_at": taken_at,
        },
    )
    return snapshot


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


def samples_event(run: Run, seq: int, step: int, records: list[dict], part: int = 0) -> dict:
    """A `samples` event as the engine and the SDK send it: the step's rollouts written as a rollout file
    in the run's folder of the store first (posttrain_sdk.rollout_files), the event naming it."""
    from posttrain.telemetry.rollouts import rollout_folder
    from posttrain_sdk import rollout_files

    table = rollout_files.rows_table(records, step, _token_columns(records))
    info = rollout_files.write_step(rollout_folder(run.id), table, step=step, part=part)
    return event(run, seq, "samples", step, info.event_data())


def unpack_f16(text: str) -> list[float]:
    """The per-token dialog's wire format back to numbers: base64 little-endian float16."""
    import base64

    import numpy as np

    return np.frombuffer(base64.b64decode(text), dtype="<f2").astype(float).tolist()


def _token_columns(records: list[dict]) -> dict:
    """Per-token columns from records that carry `tokens` ({text, <array>: base64 float16}) or plain lists."""
    from posttrain_sdk.rollout_files import TOKEN_COLUMNS

    records = [{**r, **_view_columns(r["tokens"])} if r.get("tokens") else r for r in records]
    columns: dict = {}
    for name in TOKEN_COLUMNS:
        if any(name in r for r in records):
            columns[name] = [r.get(name) for r in records]
    return columns


# The per-token view's names (as the dialog and the engine's records had them) -> the rollout file's columns.
_VIEW_TO_COLUMN = {
    "text": "token_text",
    "rollout_logprob": "rollout_logprob",
    "trainer_logprob": "trainer_logprob",
    "entropy": "entropy",
    "advantage": "token_advantage",
}


def _view_columns(view: dict) -> dict:
    """A record's `tokens` view ({text: [piece], <array>: base64 float16 or a list}) as rollout-file columns."""
    return {
        _VIEW_TO_COLUMN[name]: unpack_f16(values) if isinstance(values, str) else values
        for name, values in view.items()
        if name in _VIEW_TO_COLUMN
    }


def post_events(client, run: Run, events: list[dict], headers: dict | None = None, slash: bool = True):
    url = f"/api/runs/{run.id}/events" + ("/" if slash else "")
    return client.post(
        url,
        data=json.dumps({"events": events}),
        content_type="application/json",
        **(auth(run) if headers is None else headers),
    )


class FakeJobs:
    """Ray's Jobs API as the services see it: a dict of job statuses and logs, by Ray job id."""

    def __init__(self) -> None:
        self.statuses: dict[str, str] = {}
        self.job_logs: dict[str, str] = {}
        self.exit_codes: dict[str, int] = {}
        self.submitted: list[str] = []
        self.stopped: list[str] = []
        self.preempted: list[str] = []
        self.fail_submit: Exception | None = None
        self.stop_sets: str | None = "STOPPED"

    def submit(self, run: Run) -> str:
        if self.fail_submit is not None:
            raise self.fail_submit
        self.submitted.append(run.ray_job_id)
        self.statuses.setdefault(run.ray_job_id, "PENDING")
        return run.ray_job_id

    def stop(self, run: Run) -> bool:
        self.stopped.append(run.ray_job_id)
        if run.ray_job_id not in self.statuses:
            return False
        if self.stop_sets:
            self.statuses[run.ray_job_id] = self.stop_sets
        return True

    def status(self, run: Run) -> str | None:
        return self.statuses.get(run.ray_job_id)

    def logs(self, run: Run) -> str:
        return self.job_logs.get(run.ray_job_id, "")

    def exit_code(self, run: Run) -> int | None:
        return self.exit_codes.get(run.ray_job_id)

    def preempt(self, run: Run, reason: str) -> None:
        self.preempted.append(run.ray_job_id)


def unknown_run_id() -> str:
    return str(uuid.uuid4())


# --- admission: a fake Ray cluster view, launched runs (tests/unit/platform/test_scheduler_*.py) ---


def cluster(cpus: float = 2.0, free: float | None = None, nodes: int = 1):
    """A fake Ray cluster view for admission (`runs_admit(cluster=...)`): `nodes` nodes of `cpus` CPUs each,
    `free` of them free on each (all by default)."""
    view = ClusterView(
        [
            ClusterNode(
                f"n{i}", f"10.0.0.{i}", {"CPU": cpus, "GPU": 0.0}, {"CPU": cpus if free is None else free, "GPU": 0.0}
            )
            for i in range(nodes)
        ]
    )
    return lambda: view


def launch(experiment, user, **fields) -> Run:
    """A run launched by `user` (queued for admission), with `fields` set on it afterwards."""
    run = services.run_launch(experiment, user=user)
    if fields:
        Run.objects.filter(pk=run.pk).update(**fields)
    return run


def state(run: Run) -> str:
    """The run's state as the database has it now."""
    run.refresh_from_db()
    return run.state


def cpus(n: float) -> dict:
    """A run's stored resource needs (Run.resources): `n` CPUs for its driver, no bundles."""
    return {"driver": {"CPU": n, "GPU": 0.0}, "bundles": [], "total": {"CPU": n, "GPU": 0.0}}


def held_between(run: Run, start: datetime, end: datetime) -> None:
    """A run's history: admitted at `start`, ended at `end` (the times are set after the rows are made)."""
    first = RunTransition.objects.create(run=run, from_state=RunState.QUEUED, to_state=RunState.STARTING)
    last = RunTransition.objects.create(run=run, from_state=RunState.RUNNING, to_state=RunState.SUCCEEDED)
    RunTransition.objects.filter(pk=first.pk).update(at=start)
    RunTransition.objects.filter(pk=last.pk).update(at=end)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED, finished_at=end)


# --- registry rows (for tests that need an object but not the validation path) ---------------------


def _owned(project: Any, created_by: Any) -> dict[str, Any]:
    """The project and creator fields of a row (default: the default project, no creator)."""
    return {"project": project or default_project(), "created_by": created_by}


def a_model_row(
    name: str | None = None, path: str = "/nonexistent/model", project: Any = None, created_by: Any = None
) -> Any:
    from posttrain.registry.models import ModelAsset

    return ModelAsset.objects.create(
        name=name or f"model-{uuid.uuid4().hex[:8]}", path=path, **_owned(project, created_by)
    )


def a_dataset_row(name: str = "data", project: Any = None, created_by: Any = None) -> Any:
    from posttrain.registry.models import Dataset

    return Dataset.objects.create(
        name=name,
        sha256=uuid.uuid4().hex * 2,
        format="jsonl",
        path="/nonexistent/data.jsonl",
        size_bytes=1,
        row_count=1,
        **_owned(project, created_by),
    )


def a_reward_row(name: str | None = None, project: Any = None, created_by: Any = None) -> Any:
    from posttrain.registry.models import RewardFunction

    return RewardFunction.objects.create(
        name=name or f"reward-{uuid.uuid4().hex[:8]}",
        kind="builtin",
        spec={"type": "exact_match", "name": "exact_match"},
        **_owned(project, created_by),
    )


def an_experiment(
    model: Any = None,
    dataset: Any = None,
    rewards: list[Any] = (),
    name: str = "exp",
    project: Any = None,
    created_by: Any = None,
) -> Any:
    from posttrain.runs.models import Experiment, ExperimentReward

    owned = _owned(project, created_by)
    experiment = Experiment.objects.create(
        name=name,
        model=model or a_model_row(**owned),
        dataset=dataset or a_dataset_row(**owned),
        config={},
        **owned,
    )
    for position, reward in enumerate(rewards):
        ExperimentReward.objects.create(experiment=experiment, reward=reward, position=position)
    return experiment


def write_safetensors(path: Path, shapes: dict[str, list[int]], metadata: dict[str, str] | None = None) -> None:
    """A valid float32 safetensors file with the given tensor shapes (zeros), written by hand."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def write_model_folder(
    folder: Path, shapes: dict[str, list[int]] | None = None, *, architecture: str = "LlamaForCausalLM"
) -> Path:
    """A small model folder with config.json, one safetensors file and a tokenizer file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    write_safetensors(folder / "model.safetensors", shapes or {"w": [2, 3]})
    return folder


# --- review campaigns over runs whose samples arrive the real way (posttrain.telemetry.ingestion.events_ingest) -----------


PASS_FAIL = [{"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?"}]
PREFERENCE = [{"key": "better", "kind": "pairwise", "label": "Which answer is better?"}]


def run_with_samples(experiment: Any, steps: dict[int, list[dict[str, Any]]], name: str = "") -> Run:
    """A running run whose samples events (one per step) were ingested like the engine's."""
    run = make_run(experiment, RunState.RUNNING, name=name)
    events = [
        samples_event(run, seq, step, samples) for seq, (step, samples) in enumerate(sorted(steps.items()), start=1)
    ]
    events_ingest(run.id, events)
    return run


def sample(
    index: int, reward: float | None, prompt: str, response: str, group: int = 0, **extra: Any
) -> dict[str, Any]:
    return sample_record(
        index,
        reward=reward,
        prompt=prompt,
        response=response,
        group=group,
        components=extra.pop("components", {"exact_answer": reward}),
        **extra,
    )


def single_campaign(
    runs: list[Run],
    annotators: list[Any],
    *,
    k: int = 10,
    overlap: int = 1,
    rule: str = "random",
    questions: list[dict] | None = None,
    activate: bool = True,
    **fields: Any,
) -> Campaign:
    campaign = review.campaign_create(
        name="review",
        kind="single",
        questions=questions or PASS_FAIL,
        source={"runs": [str(r.id) for r in runs], "rule": rule, "k": k, "seed": 7, **fields.pop("source", {})},
        overlap=overlap,
        annotators=annotators,
        **{"user": a_campaign_owner(), **fields},
        project=default_project(),
    )
    return review.campaign_activate(campaign) if activate else campaign


def pair_campaign(
    runs: list[Run],
    annotators: list[Any],
    *,
    k: int = 10,
    overlap: int = 1,
    activate: bool = True,
    questions: list[dict] | None = None,
    **fields: Any,
) -> Campaign:
    campaign = review.campaign_create(
        name="prefs",
        kind="pair",
        questions=questions or PREFERENCE,
        source={"runs": [str(r.id) for r in runs], "rule": "random", "k": k, "seed": 3, **fields.pop("source", {})},
        overlap=overlap,
        annotators=annotators,
        **{"user": a_campaign_owner(), **fields},
        project=default_project(),
    )
    return review.campaign_activate(campaign) if activate else campaign


def shown_as(item: ReviewItem, sample_id: int) -> str:
    """The letter the annotator sees on the response of this sample ("A" is the one shown first)."""
    first_shown = item.rollout_b_id if item.display_swap else item.rollout_a_id
    return "A" if sample_id == first_shown else "B"


# --- every endpoint under /api/ ------------------------------------------------------------------------
# Every endpoint under /api/, found by walking the URL resolver, for permission-matrix tests.
#
#     from tests.unit.platform.helpers import api_endpoints
#     for endpoint in api_endpoints():
#         endpoint.key          # "POST /api/rewards/{pk}/try/"
#         endpoint.url(pk=3)    # "/api/rewards/3/try/"
#
# An endpoint is one (method, route) pair. Methods come from the view itself: a viewset's
# action map (`{"get": "list", "post": "create"}`), an APIView's handlers or an `@api_view`'s
# declared methods; HEAD and OPTIONS are left out (DRF answers them for every view). Routes whose
# only difference is a `.json` format suffix (DefaultRouter's extra patterns) are skipped: they
# are the same view. Route parameters appear as `{name}`, whatever the converter or regex.

IGNORED_METHODS = frozenset({"HEAD", "OPTIONS"})
_ROUTE_PARAM = re.compile(r"<(?:[^:<>]+:)?(?P<name>\w+)>")


@dataclass(frozen=True, order=True)
class Endpoint:
    route: str  # "/api/models/{pk}/"
    method: str  # "GET"
    name: str | None  # URL name, for reverse()
    params: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.method} {self.route}"

    def url(self, **params: Any) -> str:
        missing = set(self.params) - set(params)
        if missing:
            raise KeyError(f"{self.key} needs route parameters {sorted(missing)}")
        return self.route.format(**{k: params[k] for k in self.params})


def api_endpoints(prefix: str = "/api/") -> list[Endpoint]:
    """Every (method, route) served under `prefix`, sorted by route then method."""
    found: set[Endpoint] = set()
    for route, pattern in _walk(get_resolver().url_patterns, ""):
        if not route.startswith(prefix):
            continue
        params = tuple(re.findall(r"\{(\w+)\}", route))
        if "format" in params:
            continue
        for method in _methods(pattern.callback):
            found.add(Endpoint(route=route, method=method, name=pattern.name, params=params))
    return sorted(found)


def _walk(patterns: list[Any], prefix: str):
    for pattern in patterns:
        route = prefix + _route_text(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield "/" + route.lstrip("/"), pattern


def _route_text(pattern: Any) -> str:
    """`models/<int:pk>/` or `^models/(?P<pk>[^/.]+)/$` -> `models/{pk}/`."""
    text = str(pattern)
    if hasattr(pattern, "regex") and type(pattern).__name__ == "RegexPattern":
        return _regex_to_route(text)
    return _ROUTE_PARAM.sub(lambda m: "{" + m.group("name") + "}", text)


def _regex_to_route(regex: str) -> str:
    text = regex.removeprefix("^").removesuffix("$").removesuffix("\\Z")
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("(?P<", i):
            end = text.index(">", i)
            name = text[i + 4 : end]
            depth, j = 1, end + 1
            while depth and j < len(text):  # skip to the group's closing parenthesis
                if text[j] == "\\":
                    j += 2
                    continue
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            out.append("{" + name + "}")
            i = j
        elif text[i] == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _methods(callback: Any) -> list[str]:
    actions = getattr(callback, "actions", None)  # a DRF viewset bound by a router
    if actions:
        methods = {m.upper() for m in actions}
    else:
        view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if view_class is None:
            return ["GET"]  # a plain function view: it cannot tell; assume a page
        methods = {m.upper() for m in view_class.http_method_names if hasattr(view_class, m)}
    return sorted(methods - IGNORED_METHODS)
