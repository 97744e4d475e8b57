"""Every server-path field, tried by a researcher's account against the platform's own files and the host's, and
through a link to each: all refused, naming the field and the rule, none quoted (issue cases 1-4, deliveries 1
and 2). On the real stack (uvicorn, both workers, Postgres, Redis); the world is tests/security/conftest.py's:
the admin opened the whole POSTTRAIN_HOME as the import root, so the platform's own files are inside a root and
only the resolver's private rule stands between them and the researcher."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.security.helpers import (
    SECRET_MARK,
    Api,
    World,
    api_for,
    assert_stack_alive,
    experiment_body,
    registry_rows,
    server_logs,
)
from tests.support.stack import PlatformStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@dataclass(frozen=True)
class Field:
    name: str
    loc: str
    send: Callable[[Api, dict[str, Any], str], Any]  # (api, registry rows, the hostile path) -> response


def _validate(section: Callable[[str], dict[str, Any]]) -> Callable[[Api, dict[str, Any], str], Any]:
    return lambda api, rows, path: api.post(
        "/api/experiments/validate/", experiment_body(rows, "hostile", section(path))
    )


def _create_experiment(api: Api, rows: dict[str, Any], path: str) -> Any:
    return api.post("/api/experiments/", experiment_body(rows, "hostile experiment", {"data": {"eval_path": path}}))


def _checkpoint(action: str) -> Callable[[Api, dict[str, Any], str], Any]:
    """A checkpoint event naming the hostile path (a forged one) on a finished run: resumed or registered."""

    def send(api: Api, rows: dict[str, Any], path: str) -> Any:
        from posttrain.runs.models import Checkpoint

        step = Checkpoint.objects.filter(run=rows["run"]).count() + 1
        checkpoint = Checkpoint.objects.create(run=rows["run"], step=step, path=path)
        body = {"checkpoint": checkpoint.pk, **({"name": f"stolen-{checkpoint.pk}"} if action != "resume" else {})}
        return api.post(f"/api/runs/{rows['run'].pk}/{action}/", body)

    return send


FIELDS = [
    Field("dataset path", "path", lambda api, rows, p: api.post("/api/datasets/", {"path": p, "format": "csv"})),
    Field(
        "python reward spec.path",
        "spec.path",
        lambda api, rows, p: api.post("/api/rewards/", {"name": "r", "kind": "python", "spec": {"path": p}}),
    ),
    Field(
        "reward model spec.path",
        "spec.path",
        lambda api, rows, p: api.post("/api/rewards/", {"name": "rm", "kind": "reward_model", "spec": {"path": p}}),
    ),
    Field("model path", "path", lambda api, rows, p: api.post("/api/models/", {"name": "m", "path": p})),
    Field("data.eval_path", "data.eval_path", _validate(lambda p: {"data": {"eval_path": p}})),
    Field("data.eval_path at create", "data.eval_path", _create_experiment),
    Field("model.tokenizer_path", "model.tokenizer_path", _validate(lambda p: {"model": {"tokenizer_path": p}})),
    Field("environment.path", "environment.path", _validate(lambda p: {"environment": {"path": p}})),
    Field("agent.files", "agent.files.0", _validate(lambda p: {"agent": {"command": "cat f", "files": [p]}})),
]
CHECKPOINT_FIELDS = [
    Field("resume", "checkpoint", _checkpoint("resume")),
    Field("register", "checkpoint", _checkpoint("register-checkpoint")),
]


def rows_and_a_finished_run(world: World) -> dict[str, Any]:
    """What an experiment is built from, inside the import root (legitimate), and a finished run."""
    from posttrain.runs.models import Run, RunState
    from tests.unit.platform.helpers import an_experiment

    rows = registry_rows(world, "paths")
    experiment = an_experiment(rows["model"], rows["dataset"], [rows["reward"]])
    rows["run"] = Run.objects.create(experiment=experiment, name="finished", state=RunState.FAILED)
    return rows


def hostile_paths(world: World) -> list[Path]:
    """Each target by its own path and through a link to it inside the import root."""
    return [*world.targets.values(), *(world.link_to(name) for name in world.targets)]


@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
def test_every_server_path_field_refuses_the_platforms_files_and_the_hosts_and_quotes_none(
    field: Field, stack: PlatformStack, world: World
):
    api = api_for(stack, "mallory", server_paths=True)
    rows = rows_and_a_finished_run(world)
    wrong = []
    for path in hostile_paths(world):
        response = field.send(api, rows, str(path))
        expected = [{"loc": field.loc, "msg": world.expected_refusal(path)}]
        if response.status_code != 400 or response.json()["errors"] != expected:
            wrong.append(f"{path}: {response.status_code} {response.text[:300]}")
    assert not wrong, "\n".join(wrong)
    world.assert_never_quoted(*api.seen)
    assert_stack_alive(stack)


@pytest.mark.parametrize("field", CHECKPOINT_FIELDS, ids=[f.name for f in CHECKPOINT_FIELDS])
def test_a_checkpoint_event_naming_anything_but_the_runs_own_folder_is_never_read(
    field: Field, stack: PlatformStack, world: World
):
    api = api_for(stack, "mallory")
    rows = rows_and_a_finished_run(world)
    wrong = []
    for path in hostile_paths(world):
        response = field.send(api, rows, str(path))
        expected = [{"loc": "checkpoint", "msg": f"{path} is not a checkpoint folder of run {rows['run'].pk}"}]
        if response.status_code != 400 or response.json()["errors"] != expected:
            wrong.append(f"{path}: {response.status_code} {response.text[:300]}")
    assert not wrong, "\n".join(wrong)
    world.assert_never_quoted(*api.seen)


@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
def test_without_the_admins_grant_no_server_path_is_named_at_all(field: Field, stack: PlatformStack, world: World):
    api = api_for(stack, "eve")  # a researcher, not granted server paths
    rows = rows_and_a_finished_run(world)
    legitimate = world.imports / "prompts.jsonl"
    for path in (legitimate, world.targets["secret-key"], Path("/etc/passwd")):
        response = field.send(api, rows, str(path))
        assert response.status_code == 403, response.text
        [error] = response.json()["errors"]
        assert error["loc"] == field.loc and "needs the 'import server paths' permission" in error["msg"]
    world.assert_never_quoted(*api.seen)


def test_uploads_stay_open_to_a_researcher_without_the_grant_and_may_quote_their_own_file(stack: PlatformStack):
    api = api_for(stack, "eve")
    own = "question,answer\n1+1=,2\n"
    refused = api.post("/api/datasets/", files={"file": ("mine.csv", own)}, data={"prompt_field": "prompt"})
    assert refused.status_code == 400
    assert refused.json()["errors"] == [
        {
            "loc": "prompt_field",
            "msg": "column 'prompt' is not in the CSV header ('question', 'answer') (is the first line a header "
            "naming the columns?); set prompt_field to the column to use",
        }
    ]
    fields = {"prompt_field": "question", "label_field": "answer"}
    created = api.post("/api/datasets/", files={"file": ("mine.csv", own)}, data=fields)
    assert created.status_code == 201, created.text


def test_the_engines_example_environments_need_no_grant(stack: PlatformStack, world: World):
    import rl_engine

    api = api_for(stack, "eve")
    example = Path(rl_engine.__file__).parent / "environments" / "calculator.py"
    response = _validate(lambda p: {"environment": {"path": p, "name": "Calculator"}})(
        api, rows_and_a_finished_run(world), str(example)
    )
    assert response.status_code == 200, response.text


# --- errors about a file on the server name the field and the rule, never its content (delivery 2) -----------


def _parquet_with_secret_columns() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({f"{SECRET_MARK}-a": ["x"], f"{SECRET_MARK}-b": ["y"]}), buffer)
    return buffer.getvalue()


SERVER_FILES = [
    # (file in the import root, its content, the request, the one error expected)
    (
        "first-line.csv",
        f"{SECRET_MARK}:x:0:0:root:/root:/bin/bash\n1,2\n",
        {"format": "csv"},
        {
            "loc": "prompt_field",
            "msg": "column 'prompt' is not in the CSV header (1 field, not shown for a file on the server) (is the "
            "first line a header naming the columns?); set prompt_field to the column to use",
        },
    ),
    (
        "keys.jsonl",
        json.dumps({SECRET_MARK: "x", "other": "y"}) + "\n",
        {"format": "jsonl"},
        {
            "loc": "prompt_field",
            "msg": "line 1: field 'prompt' is missing (the row has: 2 fields, not shown for a file on the server); "
            "set prompt_field to the field to use",
        },
    ),
    (
        "twice.csv",
        f"prompt,{SECRET_MARK},{SECRET_MARK}\na,b,c\n",
        {"format": "csv"},
        {"loc": "path", "msg": "line 1: the name of column 2 appears twice in the CSV header (again in column 3)"},
    ),
    (
        "columns.parquet",
        _parquet_with_secret_columns(),
        {"format": "parquet"},
        {
            "loc": "prompt_field",
            "msg": "column 'prompt' is not in the Parquet columns (2 fields, not shown for a file on the server); "
            "set prompt_field to the column to use",
        },
    ),
]


@pytest.mark.parametrize(("name", "content", "fields", "error"), SERVER_FILES, ids=[f[0] for f in SERVER_FILES])
def test_a_dataset_on_the_server_that_does_not_parse_is_refused_without_a_byte_of_it(
    name, content, fields, error, stack: PlatformStack, world: World
):
    path = world.imports / "server-files" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    api = api_for(stack, "mallory", server_paths=True)
    response = api.post("/api/datasets/", {"path": str(path), **fields})
    assert response.status_code == 400 and response.json()["errors"] == [error]
    world.assert_never_quoted(*api.seen)


def test_a_python_file_on_the_server_that_does_not_import_is_refused_without_its_first_word(
    stack: PlatformStack, world: World
):
    secret = world.imports / "server-files" / "notes.py"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(f"{SECRET_MARK}\n")  # importing it is a NameError naming its first word
    api = api_for(stack, "mallory", server_paths=True)
    response = api.post("/api/rewards/", {"name": "notes", "kind": "python", "spec": {"path": str(secret)}})
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {
            "loc": "spec.path",
            "msg": "the file does not import as a reward (1 problem(s): a syntax error, an exception at import, or "
            "no reward_func / compute_score); the messages quote the file, so they are shown only for code sent "
            "as source",
        }
    ]
    world.assert_never_quoted(*api.seen)


def test_a_model_folder_on_the_server_with_a_broken_config_is_not_quoted(stack: PlatformStack, world: World):
    from tests.unit.platform.helpers import write_model_folder

    folder = write_model_folder(world.imports / "server-files" / "broken-model")
    (folder / "config.json").write_bytes(b"\xff" + SECRET_MARK.encode())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": f"{SECRET_MARK}.bin"}}))
    api = api_for(stack, "mallory", server_paths=True)
    response = api.post("/api/models/", {"name": "broken", "path": str(folder)})
    assert response.status_code == 400
    assert response.json()["errors"] == [{"loc": "path", "msg": f"config.json in {folder} is not UTF-8 text"}]
    (folder / "config.json").write_text('{"architectures": ["X"]}')
    response = api.post("/api/models/", {"name": "broken", "path": str(folder)})
    assert response.json()["errors"] == [
        {
            "loc": "path",
            "msg": f"1 of the 1 shards model.safetensors.index.json lists are missing from {folder}",
        }
    ]
    world.assert_never_quoted(*api.seen)


def test_no_planted_secret_reached_a_servers_log(stack: PlatformStack, world: World):
    """After every request of this file (it runs last here): the logs hold none of it either."""
    world.assert_never_quoted(*server_logs(stack))
    assert_stack_alive(stack)
