"""Malformed inputs, one table: each gets a 4xx whose message names the problem, never a 500.

A case is a name, a `send(client, ctx)` that makes one request as a researcher, the status
expected and a piece of text the error must contain. Add cases by appending to CASES (configs,
event batches, ...); `ctx` gives a temporary folder, the settings and a way to make registry
rows, so most cases are one line.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from tests.unit.platform.helpers import (
    a_dataset_row,
    a_model_row,
    a_reward_row,
    an_experiment,
    grant_server_paths,
    write_model_folder,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _researcher_may_name_server_paths(researcher):
    """These tests register files on the server, which an admin grants (tests/security tries it without)."""
    grant_server_paths(researcher)


@dataclass
class Ctx:
    tmp: Path
    settings: Any

    def file(self, name: str, content: bytes | str) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path


@dataclass(frozen=True)
class Case:
    id: str
    send: Callable[[APIClient, Ctx], Any]
    expect: str  # text the error body must contain
    status: int = 400


# --- request helpers -------------------------------------------------------------------------


def dataset(content: bytes | str, filename: str = "data.jsonl", **fields: str) -> Callable[[APIClient, Ctx], Any]:
    raw = content.encode() if isinstance(content, str) else content
    return lambda client, ctx: client.post(
        "/api/datasets/", {"file": SimpleUploadedFile(filename, raw), **fields}, format="multipart"
    )


def dataset_over_limit(client: APIClient, ctx: Ctx) -> Any:
    ctx.settings.DATASET_MAX_BYTES = 64
    return dataset('{"prompt": "a long enough prompt to pass sixty-four bytes", "label": "1"}\n' * 2)(client, ctx)


def parquet_without_prompt(client: APIClient, ctx: Ctx) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"question": ["q"], "label": ["a"]}), buffer)
    return dataset(buffer.getvalue(), "d.parquet")(client, ctx)


OUTSIDE = "is outside the server folders an admin opened for imports (POSTTRAIN_IMPORT_ROOTS)"
PRIVATE = "is one of the platform's own files or folders, which no path may name"


def whole_disk_open(send_of: Callable[[Ctx], Callable[[APIClient, Ctx], Any]]) -> Callable[[APIClient, Ctx], Any]:
    """The request `send_of(ctx)` makes, with `/` as the import root (an admin who opened everything)."""

    def send(client: APIClient, ctx: Ctx) -> Any:
        ctx.settings.IMPORT_ROOTS = [Path("/")]
        return send_of(ctx)(client, ctx)

    return send


def dataset_path(path: str) -> Callable[[APIClient, Ctx], Any]:
    return lambda client, ctx: client.post("/api/datasets/", {"path": path}, format="json")


def reward(kind: str, spec: Any = None, source: str | None = None, name: str = "r") -> Callable[[APIClient, Ctx], Any]:
    body: dict[str, Any] = {"name": name, "kind": kind}
    if spec is not None:
        body["spec"] = spec
    if source is not None:
        body["source"] = source
    return lambda client, ctx: client.post("/api/rewards/", body, format="json")


def reward_model_at_empty_folder(client: APIClient, ctx: Ctx) -> Any:
    (ctx.tmp / "not-a-model").mkdir()
    return reward("reward_model", {"path": str(ctx.tmp / "not-a-model")})(client, ctx)


def try_with(samples: Any) -> Callable[[APIClient, Ctx], Any]:
    return lambda client, ctx: client.post(
        f"/api/rewards/{a_reward_row().pk}/try/", {"samples": samples}, format="json"
    )


def model(path_of: Callable[[Ctx], Path | str], name: str = "m") -> Callable[[APIClient, Ctx], Any]:
    return lambda client, ctx: client.post("/api/models/", {"name": name, "path": str(path_of(ctx))}, format="json")


def folder_without_config(ctx: Ctx) -> Path:
    (ctx.tmp / "empty").mkdir()
    return ctx.tmp / "empty"


def folder_without_weights(ctx: Ctx) -> Path:
    folder = write_model_folder(ctx.tmp / "m")
    (folder / "model.safetensors").unlink()
    return folder


def folder_without_tokenizer(ctx: Ctx) -> Path:
    folder = write_model_folder(ctx.tmp / "m")
    (folder / "tokenizer.json").unlink()
    return folder


def folder_with_broken_config(ctx: Ctx) -> Path:
    folder = write_model_folder(ctx.tmp / "m")
    (folder / "config.json").write_text("{not json")
    return folder


def folder_with_corrupt_weights(ctx: Ctx) -> Path:
    folder = write_model_folder(ctx.tmp / "m")
    (folder / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")
    return folder


def duplicate_model_name(client: APIClient, ctx: Ctx) -> Any:
    folder = write_model_folder(ctx.tmp / "m")
    client.post("/api/models/", {"name": "twice", "path": str(folder)}, format="json")
    return client.post("/api/models/", {"name": "twice", "path": str(folder)}, format="json")


def config_yaml(text: str) -> Callable[[APIClient, Ctx], Any]:
    return lambda client, ctx: client.post("/api/config/yaml/", {"yaml": text}, format="json")


def experiment_validate(config: Any) -> Callable[[APIClient, Ctx], Any]:
    return lambda client, ctx: client.post(
        "/api/experiments/validate/",
        {
            "name": "e",
            "model": a_model_row().pk,
            "dataset": a_dataset_row().pk,
            "rewards": [{"reward": a_reward_row().pk, "weight": 1}],
            "config": config,
        },
        format="json",
    )


def deep_json(url: str) -> Callable[[APIClient, Ctx], Any]:
    """A JSON body nested 100,000 deep (`[[[[...`): the parser's recursion limit, not a 500."""
    return lambda client, ctx: client.generic("POST", url, "[" * 100_000, content_type="application/json")


def experiment_on_a_short_context_model(new_tokens: int) -> Callable[[APIClient, Ctx], Any]:
    """A model whose config.json allows 128 positions, asked for `new_tokens` new tokens."""

    def send(client: APIClient, ctx: Ctx) -> Any:
        folder = ctx.tmp / "short-model"
        folder.mkdir()
        (folder / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 128}')
        return client.post(
            "/api/experiments/validate/",
            {
                "name": "e",
                "model": a_model_row(path=str(folder)).pk,
                "dataset": a_dataset_row().pk,
                "rewards": [{"reward": a_reward_row().pk, "weight": 1}],
                "config": {"rollout": {"max_new_tokens": new_tokens}},
            },
            format="json",
        )

    return send


def run_get(path: str, params: dict[str, Any]) -> Callable[[APIClient, Ctx], Any]:
    """GET /api/runs/<a new run>/<path> with these query parameters."""

    def send(client: APIClient, ctx: Ctx) -> Any:
        from posttrain.runs.models import Run

        run = Run.objects.create(experiment=an_experiment(), state="running")
        return client.get(f"/api/runs/{run.pk}/{path}", params)

    return send


def compare_get(path: str, params: dict[str, Any], with_run: bool = False) -> Callable[[APIClient, Ctx], Any]:
    """GET /api/compare/<path> with these query parameters (and `runs` = a new run, if asked)."""

    def send(client: APIClient, ctx: Ctx) -> Any:
        from posttrain.runs.models import Run

        runs = {"runs": str(Run.objects.create(experiment=an_experiment(), state="running").pk)} if with_run else {}
        return client.get(f"/api/compare/{path}", {**runs, **params})

    return send


def review_campaign(**overrides: Any) -> Callable[[APIClient, Ctx], Any]:
    """POST /api/review/campaigns/ with a body over a new run (it has no samples), changed by `overrides`."""

    def send(client: APIClient, ctx: Ctx) -> Any:
        from posttrain.runs.models import Run

        run = Run.objects.create(experiment=an_experiment(), state="running")
        body = {
            "name": "c",
            "questions": [{"key": "ok", "kind": "pass_fail", "label": "OK?"}],
            "source": {"runs": [str(run.pk)], "rule": "random", "k": 1},
            **overrides,
        }
        return client.post("/api/review/campaigns/", body, format="json")

    return send


def review_export(params: dict[str, Any]) -> Callable[[APIClient, Ctx], Any]:
    def send(client: APIClient, ctx: Ctx) -> Any:
        from posttrain.review.models import Campaign

        campaign = Campaign.objects.create(name="c", questions=[], source={})
        return client.get(f"/api/review/campaigns/{campaign.pk}/export/", params)

    return send


GOOD = '{"prompt": "1+1=", "label": "2"}\n'

CASES: list[Case] = [
    # --- datasets ---
    Case(
        "dataset-bad-utf8",
        dataset(GOOD.encode() + b'{"prompt": "caf\xe9", "label": "x"}\n'),
        "line 2: not valid UTF-8 (byte offset 48: invalid continuation byte)",
    ),
    Case(
        "dataset-bad-json-line",
        dataset(GOOD + '{"prompt": "a" "label": "b"}\n'),
        "line 2: not valid JSON (Expecting ',' delimiter at column 16)",
    ),
    Case(
        "dataset-line-not-an-object", dataset(GOOD + '["1+1=", "2"]\n'), "line 2: expected a JSON object, got an array"
    ),
    Case("dataset-missing-prompt-field", dataset(GOOD * 2 + '{"label": "3"}\n'), "line 3: field 'prompt' is missing"),
    Case("dataset-missing-label-field", dataset(GOOD + '{"prompt": "2+2="}\n'), "line 2: field 'label' is missing"),
    Case("dataset-empty-prompt", dataset(GOOD + '{"prompt": "  ", "label": "0"}\n'), "line 2: field 'prompt' is empty"),
    Case(
        "dataset-prompt-not-a-string",
        dataset('{"prompt": 12, "label": "0"}\n'),
        "line 1: field 'prompt' must be a string, got a number",
    ),
    Case(
        "dataset-wrong-prompt-mapping",
        dataset(GOOD, prompt_field="question"),
        "field 'question' is missing (the row has: 'prompt', 'label'); set prompt_field",
    ),
    Case(
        "dataset-wrong-label-mapping",
        dataset("prompt,label\na,b\n", "d.csv", label_field="answer"),
        "column 'answer' is not in the CSV header",
    ),
    Case("dataset-empty-file", dataset(b""), "The submitted file is empty"),
    Case(
        "dataset-empty-server-file",
        lambda client, ctx: dataset_path(str(ctx.file("e.jsonl", b"")))(client, ctx),
        "path: the file is empty",
    ),
    Case("dataset-blank-lines-only", dataset("\n\n  \n"), "the file has no rows"),
    Case("dataset-over-size-limit", dataset_over_limit, "over the size limit of 64 bytes (DATASET_MAX_BYTES"),
    Case(
        "dataset-csv-without-header",
        dataset("1+1=,2\n2+2=,4\n", "d.csv"),
        "is the first line a header naming the columns?",
    ),
    Case(
        "dataset-csv-ragged-row",
        dataset("prompt,label\na,b\nc,d,e\n", "d.csv"),
        "line 3: has 3 fields, the header has 2",
    ),
    Case(
        "dataset-csv-duplicate-column",
        dataset("prompt,label,prompt\na,b,c\n", "d.csv"),
        "column 'prompt' appears twice",
    ),
    Case("dataset-csv-header-only", dataset("prompt,label\n", "d.csv"), "no rows after the header"),
    Case(
        "dataset-unreadable-parquet",
        dataset(b"PAR1 this is not parquet PAR1", "d.parquet"),
        "not a readable Parquet file",
    ),
    Case(
        "dataset-parquet-without-prompt-column", parquet_without_prompt, "column 'prompt' is not in the Parquet columns"
    ),
    Case("dataset-byte-order-mark", dataset(b"\xef\xbb\xbf" + GOOD.encode()), "byte order mark"),
    Case("dataset-unknown-format", dataset(GOOD, format="xml"), '"xml" is not a valid choice'),
    Case("dataset-unknown-extension", dataset(GOOD, "data.txt"), "cannot tell the format of 'data.txt'"),
    Case(
        "dataset-no-file-no-path",
        lambda client, ctx: client.post("/api/datasets/", {}, format="multipart"),
        "No file was submitted",
    ),
    Case("dataset-file-and-path", dataset(GOOD, path="/data/x.jsonl"), "not both"),
    Case(
        "dataset-path-missing",
        lambda client, ctx: dataset_path(str(ctx.tmp / "prompts.jsonl"))(client, ctx),
        "prompts.jsonl does not exist",
    ),
    Case("dataset-path-outside-the-import-roots", dataset_path("/nonexistent/prompts.jsonl"), OUTSIDE),
    Case("dataset-path-relative", dataset_path("prompts.jsonl"), "must be an absolute path"),
    # --- rewards ---
    Case(
        "reward-python-syntax-error",
        reward("python", source="def reward_func(queries, prompts, labels):\n    return [1.0 for q in queries\n"),
        "syntax error at line 2",
    ),
    Case(
        "reward-python-missing-function",
        reward("python", source="def score(x):\n    return 1\n"),
        "defines neither reward_func",
    ),
    Case(
        "reward-python-named-function-missing",
        reward("python", {"function": "my_reward"}, source="def other(q, p, l):\n    return []\n"),
        "no function named 'my_reward'",
    ),
    Case(
        "reward-python-import-error",
        reward("python", source="x = 1\ny = x / 0\n"),
        "ZeroDivisionError: division by zero (line 2)",
    ),
    Case("reward-python-no-source", reward("python", {}), "source"),
    Case(
        "reward-python-server-file-missing",
        lambda client, ctx: reward("python", {"path": str(ctx.tmp / "reward.py")})(client, ctx),
        "reward.py does not exist",
    ),
    Case("reward-python-server-file-outside-the-roots", reward("python", {"path": "/etc/hostname"}), OUTSIDE),
    Case("reward-unknown-builtin-type", reward("builtin", {"type": "bleu"}), "'bleu' is not a builtin reward type"),
    Case("reward-type-of-another-kind", reward("builtin", {"type": "http", "url": "http://x"}), "or use kind 'http'"),
    Case("reward-builtin-without-type", reward("builtin", {}), "required for a builtin reward"),
    Case("reward-bad-regex", reward("builtin", {"type": "regex", "pattern": "[a-"}), "invalid regular expression"),
    Case("reward-regex-missing-pattern", reward("builtin", {"type": "regex"}), "Field required"),
    Case(
        "reward-length-penalty-zero-budget",
        reward("builtin", {"type": "length_penalty", "max_chars": 0, "coef": 0.1}),
        "greater than or equal to 1",
    ),
    Case(
        "reward-unknown-spec-field",
        reward("builtin", {"type": "regex", "patern": "x"}),
        "unknown field 'patern' (did you mean 'pattern'?)",
    ),
    Case(
        "reward-http-url-not-http",
        reward("http", {"url": "ftp://rm.example/score"}),
        "must be an http:// or https:// URL with a host",
    ),
    Case(
        "reward-http-negative-retries",
        reward("http", {"url": "http://rm", "retries": -1}),
        "greater than or equal to 0",
    ),
    Case("reward-model-missing-path", reward("reward_model", {}), "Field required"),
    Case("reward-model-path-not-a-model", reward_model_at_empty_folder, "no config.json in"),
    Case("reward-spec-not-an-object", reward("builtin", ["regex"]), "must be a JSON object"),
    Case(
        "reward-spec-with-weight",
        reward("builtin", {"type": "exact_match", "weight": 2}),
        "set the weight where an experiment uses the reward",
    ),
    Case(
        "reward-bad-component-name",
        reward("builtin", {"type": "exact_match", "name": "has space"}),
        "may contain only letters, digits",
    ),
    Case(
        "reward-nul-in-spec",
        reward("builtin", {"type": "regex", "pattern": "a\x00b"}),
        "spec.pattern: must not contain NUL characters",
    ),
    Case("reward-unknown-kind", reward("shell", {"type": "exact_match"}), '"shell" is not a valid choice'),
    Case(
        "reward-source-for-builtin",
        reward("builtin", {"type": "exact_match"}, source="print(1)"),
        "only python rewards take source code",
    ),
    Case("reward-try-no-samples", try_with([]), "samples"),
    Case("reward-try-sample-without-response", try_with([{"prompt": "p"}]), "response"),
    Case("reward-try-too-many-samples", try_with([{"prompt": "p", "response": "r"}] * 33), "no more than 32"),
    Case(
        "reward-try-label-an-object",
        try_with([{"prompt": "p", "response": "r", "label": {"a": 1}}]),
        "must be a string, a number or null",
    ),
    # --- models ---
    Case("model-no-config-json", model(folder_without_config), "no config.json in"),
    Case("model-no-weights", model(folder_without_weights), "no weights in"),
    Case("model-no-tokenizer", model(folder_without_tokenizer), "no tokenizer in"),
    Case("model-config-not-json", model(folder_with_broken_config), "config.json in"),
    Case("model-corrupt-safetensors-header", model(folder_with_corrupt_weights), "corrupt safetensors header"),
    Case("model-path-does-not-exist", model(lambda ctx: ctx.tmp / "no-model"), "no-model does not exist"),
    Case("model-path-outside-the-import-roots", model(lambda ctx: "/nonexistent/model"), OUTSIDE),
    Case("model-path-is-a-file", model(lambda ctx: ctx.file("weights.bin", b"x")), "is not a folder"),
    Case("model-duplicate-name", duplicate_model_name, "a model named 'twice' already exists"),
    Case("model-empty-name", model(folder_without_config, name=""), "This field may not be blank"),
    # --- run config (launch form) ---
    Case(
        "config-yaml-bad-indentation", config_yaml("rollout:\n  top_k: 4\n top_p: 0.9\n"), "YAML syntax error at line 3"
    ),
    Case("config-yaml-duplicate-key", config_yaml("seed: 1\nseed: 2\n"), "duplicate key 'seed' (first at line 1)"),
    Case("config-yaml-a-list", config_yaml("- seed\n"), "must be a mapping of sections, got a list"),
    Case(
        "config-yaml-alias-bomb",
        config_yaml(
            "a: &a [0,0,0,0,0,0,0,0,0,0]\n"
            + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(6))
        ),
        "is an alias expanding without end?",
    ),
    Case(
        "config-validate-unknown-field",
        experiment_validate({"rollout": {"temprature": 0.7}}),
        "unknown field 'temprature' (did you mean 'temperature'?)",
    ),
    Case(
        "config-validate-response-longer-than-the-context",
        experiment_on_a_short_context_model(100_000),
        "rollout.max_new_tokens: 100000 tokens do not fit the model's context length of 128 tokens",
    ),
    Case(  # beyond any context: past the rollout file's bound on a response (posttrain_sdk.rollout_files)
        "config-validate-response-longer-than-a-rollout-holds",
        experiment_on_a_short_context_model(10**9),
        "rollout.max_new_tokens: Input should be less than or equal to 131072",
    ),
    Case("deep-json-reward-create", deep_json("/api/rewards/"), "nested too deeply"),
    # Even where an admin opened the whole disk, the platform's own files stay closed.
    Case(
        "reward-from-the-secret-key-file",
        whole_disk_open(lambda ctx: reward("python", {"path": str(ctx.settings.STATE_DIR / "secret_key")})),
        PRIVATE,
    ),
    Case(
        "dataset-from-another-runs-folder",
        lambda client, ctx: dataset_path(str(ctx.file("storage/runs/r1/events.jsonl", '{"prompt": "x"}\n')))(
            client, ctx
        ),
        PRIVATE,
    ),
    Case(
        "environment-file-is-the-secret-key",
        whole_disk_open(
            lambda ctx: experiment_validate({"environment": {"path": str(ctx.settings.STATE_DIR / "secret_key")}})
        ),
        PRIVATE,
    ),
    Case(
        "agent-file-is-the-brokers-database",
        whole_disk_open(
            lambda ctx: experiment_validate(
                {"agent": {"command": "cat broker", "files": [str(ctx.settings.STATE_DIR / "celery-broker.sqlite3")]}}
            )
        ),
        PRIVATE,
    ),
    Case("dataset-from-proc", whole_disk_open(lambda ctx: dataset_path("/proc/self/environ")), PRIVATE),
    Case("deep-json-experiment-validate", deep_json("/api/experiments/validate/"), "nested too deeply"),
    Case("deep-json-review-campaign", deep_json("/api/review/campaigns/"), "nested too deeply"),
    Case("deep-json-dataset-line", dataset(GOOD + "[" * 100_000 + "\n"), "line 2: the JSON is nested too deeply"),
    Case(
        "config-validate-platform-field",
        experiment_validate({"data": {"path": "/x.jsonl"}}),
        "comes from the experiment's registry dataset",
    ),
    # --- metric series, export, compare ---
    Case(
        "series-unknown-x-axis",
        run_get("series/", {"x": "wall"}),
        "must be one of step, samples, tokens, time, got 'wall'",
    ),
    Case("series-max-points-too-small", run_get("series/", {"max_points": 5}), "must be between 10 and 20000"),
    Case("series-max-points-not-a-number", run_get("series/", {"max_points": "all"}), "must be an integer, got 'all'"),
    Case("export-unknown-format", run_get("export/", {"format": "xlsx"}), "must be one of csv, jsonl, got 'xlsx'"),
    Case("compare-without-runs", compare_get("", {}), "required: one or more run ids"),
    Case("compare-run-id-not-a-uuid", compare_get("", {"runs": "run-1,run-2"}), "'run-1' is not a run id"),
    Case(
        "compare-unknown-run",
        compare_get("", {"runs": "00000000-0000-4000-8000-000000000000"}),
        "no run with id 00000000-0000-4000-8000-000000000000",
    ),
    Case(
        "compare-unknown-x-axis",
        compare_get("", {"x": "epoch"}, with_run=True),
        "must be one of step, samples, tokens, time",
    ),
    Case("compare-prompts-without-runs", compare_get("prompts/", {"q": "2+2"}), "required: one or more run ids"),
    Case(
        "compare-samples-without-prompt", compare_get("samples/", {}, with_run=True), "required: the exact prompt text"
    ),
    Case(
        "compare-samples-step-not-a-number",
        compare_get("samples/", {"prompt": "p", "step": "last"}, with_run=True),
        "must be an integer, got 'last'",
    ),
    Case(
        "stream-last-event-id-not-a-seq",
        run_get("stream/", {"last_event_id": "12abc"}),
        "last_event_id: must be an event seq (an integer between 0 and 9223372036854775807), got '12abc'",
    ),
    # --- review campaigns ---
    Case(
        "review-rating-max-below-min",
        review_campaign(questions=[{"key": "q", "kind": "rating", "label": "Q", "min": 5, "max": 1}]),
        "questions[0].max: must be greater than min (5)",
    ),
    Case(
        "review-pairwise-in-single-campaign",
        review_campaign(questions=[{"key": "p", "kind": "pairwise", "label": "Better?"}]),
        "pairwise questions need a pair campaign",
    ),
    Case(
        "review-tags-without-options",
        review_campaign(questions=[{"key": "t", "kind": "tags", "label": "Tags"}]),
        "questions[0].options: required: a list of at least one tag",
    ),
    Case(
        "review-unknown-rule",
        review_campaign(source={"runs": ["00000000-0000-4000-8000-000000000000"], "rule": "median"}),
        "source.rule: must be one of random, lowest_reward",
    ),
    Case(
        "review-unknown-run",
        review_campaign(source={"runs": ["00000000-0000-4000-8000-000000000000"]}),
        "no run with id 00000000-0000-4000-8000-000000000000",
    ),
    Case("review-source-selects-nothing", review_campaign(), "selects no items"),
    Case(
        "review-export-unknown-format",
        review_export({"format": "xlsx"}),
        "must be one of trl, openai, prm, ratings_jsonl, ratings_csv, got 'xlsx'",
    ),
]


def test_the_table_has_at_least_twenty_cases_with_unique_ids():
    assert len(CASES) >= 20
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_input_gets_a_4xx_that_names_the_problem(case: Case, researcher_client, tmp_path, settings):
    response = case.send(researcher_client, Ctx(tmp=tmp_path, settings=settings))
    assert response.status_code == case.status, response.content[:500]
    assert 400 <= response.status_code < 500
    messages = _messages(response.json())
    assert case.expect in messages, messages


def _messages(body: Any) -> str:
    """All the error text of an error body (the API's one contract), each error as `loc: msg`."""
    return " ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in body["errors"])
