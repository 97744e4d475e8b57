"""The SDK and the `posttrain` CLI against a live server: uvicorn on the test database (Postgres), the
CLI as a separate process with its own config folder. Every command once, bad input included (a missing
file, a wrong field, no login, a revoked token); external runs tracked with the SDK, followed live, through
an outage of the web server, and lost when their client is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rl_engine.ledger import LEDGER_FILE, Draw, PromptLedger, SampleOutcome
from tests.support.stack import REPO_ROOT, PlatformStack, UvicornServer, free_port, platform_stack, postgres_url

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a-long-test-passphrase"


@pytest.fixture(scope="module")
def sdk_stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[PlatformStack]:
    """uvicorn and a Celery worker (a python reward's import is checked on a worker, in its sandbox). No Ray
    head: a launched run stays queued while its submission is retried, which is what these tests look at."""
    from django.conf import settings
    from django.db import connection

    no_ray = f"http://127.0.0.1:{free_port()}"
    with platform_stack(
        no_ray,
        tmp_path_factory.mktemp("sdk-web"),
        postgres_url(connection.settings_dict),
        # the tests mint tokens and sessions in this process: the servers must derive the same ones
        extra_env={"POSTTRAIN_SECRET_KEY": settings.SECRET_KEY, "POSTTRAIN_SSE_KEEPALIVE_S": "1"},
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def web(sdk_stack: PlatformStack) -> UvicornServer:
    return sdk_stack.web


@pytest.fixture
def user():
    from tests.unit.platform.helpers import a_researcher, grant_server_paths

    # A member of the default project, her only one (creates go there); `posttrain models register` names a
    # folder on the server: an admin granted that.
    return grant_server_paths(a_researcher("ada"))


def terminal_of(web: UvicornServer, home: Path) -> Any:
    """Runs `posttrain …` as a user would, with the config folder `home/config`; returns (code, stdout, stderr)."""
    env = {**os.environ, "POSTTRAIN_CONFIG_DIR": str(home / "config"), "COLUMNS": "200"}
    for name in ("POSTTRAIN_TOKEN", "POSTTRAIN_PROJECT"):
        env.pop(name, None)

    def run(*args: str, stdin: str = "", timeout: float = 120) -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "posttrain_sdk", "--url", web.url, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            cwd=home,
            timeout=timeout,
        )
        return done.returncode, done.stdout, done.stderr

    run.env = env  # type: ignore[attr-defined]
    return run


@pytest.fixture
def cli(web, tmp_path, user):
    return terminal_of(web, tmp_path)


@pytest.fixture
def logged_in(cli):
    code, out, err = cli("login", "-u", "ada", "--password-stdin", stdin=PASSWORD + "\n")
    assert code == 0, err
    return cli


@pytest.fixture
def token(user) -> str:
    from posttrain.accounts.services import token_get_or_create

    return token_get_or_create(user).key


def test_login_is_stored_per_server_and_refusals_say_what_to_do(cli, web, tmp_path, user):
    code, _, err = cli("runs", "ls")
    assert code == 3 and f"error: not logged in to {web.url}: run `posttrain login --url {web.url}`" in err
    code, _, err = cli("login", "-u", "ada", "--password-stdin", stdin="wrong\n")
    assert code == 1 and err.strip() == "error: Unable to log in with provided credentials."
    code, out, _ = cli("login", "-u", "ada", "--password-stdin", stdin=PASSWORD + "\n")
    assert code == 0 and out.strip() == f"Logged in to {web.url} as ada (researcher)"
    stored = tmp_path / "config" / "credentials.json"
    assert stored.stat().st_mode & 0o777 == 0o600
    assert json.loads(stored.read_text())["default"] == web.url
    code, out, _ = cli("whoami", "--json")
    assert code == 0 and json.loads(out)["username"] == "ada"

    from rest_framework.authtoken.models import Token

    Token.objects.filter(user=user).delete()  # revoked by an admin (DRF tokens do not expire by themselves)
    code, _, err = cli("runs", "ls")
    assert code == 3 and "refused the token" in err and "posttrain login" in err
    code, out, _ = cli("logout")
    assert code == 0 and json.loads(stored.read_text())["servers"] == {}


def test_login_takes_its_server_as_the_readme_and_the_not_logged_in_error_say(web, tmp_path, user):
    env = {**os.environ, "POSTTRAIN_CONFIG_DIR": str(tmp_path / "config")}
    for name in ("POSTTRAIN_URL", "POSTTRAIN_TOKEN"):
        env.pop(name, None)

    def posttrain(*args: str, stdin: str = "") -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "posttrain_sdk", *args], input=stdin, capture_output=True, text=True, env=env
        )
        return done.returncode, done.stdout, done.stderr

    code, out, err = posttrain("login", "--url", web.url, "-u", "ada", "--password-stdin", stdin=PASSWORD + "\n")
    assert code == 0 and out.strip() == f"Logged in to {web.url} as ada (researcher)", err
    code, out, err = posttrain("whoami")  # the server logged in to last is the default
    assert code == 0 and out.splitlines()[0] == f"ada (researcher) on {web.url}", err
    assert out.splitlines()[1].startswith("project: none chosen; lists show every project you read")
    code, out, err = posttrain("logout", "--url", web.url)
    assert code == 0 and out.strip() == f"Logged out of {web.url}", err
    code, _, err = posttrain("--url", web.url, "whoami")
    assert code == 3 and f"run `posttrain login --url {web.url}`" in err


def runs_sharing_an_id_prefix(user) -> list[str]:
    """Two finished runs whose ids both start with abcdef12 (one more digit tells them apart)."""
    import uuid

    from posttrain.registry.models import Dataset, ModelAsset
    from posttrain.runs.models import Experiment, Run, RunState

    model = ModelAsset.objects.create(name="prefix-model", path="/nonexistent")
    data = Dataset.objects.create(
        name="prefix-data", sha256="0" * 64, format="jsonl", path="/nonexistent", size_bytes=0, row_count=0
    )
    experiment = Experiment.objects.create(name="prefixes", model=model, dataset=data, config={}, created_by=user)
    ids = ["abcdef12-0000-4000-8000-000000000001", "abcdef12-9999-4000-8000-000000000002"]
    for i, run_id in enumerate(ids):
        Run.objects.create(
            id=uuid.UUID(run_id), experiment=experiment, name=f"prefix {i}", state=RunState.SUCCEEDED, created_by=user
        )
    return ids


def test_a_run_is_named_by_any_unique_start_of_its_id_and_tables_show_short_ids(logged_in, user, tmp_path):
    cli = logged_in
    first, second = runs_sharing_an_id_prefix(user)

    code, out, err = cli("runs", "show", "abcdef12-0")
    assert code == 0 and first in out and "prefix 0" in out, err
    code, out, err = cli("runs", "samples", "ABCDEF129", "--json")  # either case, dashes optional
    assert code == 0 and json.loads(out) == [], err
    code, _, err = cli("runs", "export", "abcdef12-9")
    assert code == 0 and (tmp_path / f"{second}.csv").is_file(), err  # named by the whole id
    code, _, err = cli("runs", "show", "abcdef12")
    assert code == 2 and "'abcdef12' is the start of 2 run ids" in err and first in err and second in err
    code, _, err = cli("runs", "cancel", "0123")
    assert code == 1 and err.strip() == "error: run: no run id starts with '0123'"
    code, _, err = cli("runs", "show", "not-an-id")
    assert code == 2 and "is not a run id nor the start of one" in err

    narrow = subprocess.run(
        [sys.executable, "-m", "posttrain_sdk", "runs", "ls"],
        capture_output=True,
        text=True,
        env={**cli.env, "COLUMNS": "80"},
        cwd=tmp_path,
    )
    lines = narrow.stdout.rstrip("\n").splitlines()
    assert narrow.returncode == 0 and len(lines) == 3 and all(len(line) <= 80 for line in lines), narrow.stdout
    assert sorted(line.split()[0] for line in lines[1:]) == ["abcdef12", "abcdef12"]


def test_registry_experiments_and_runs_from_the_terminal(logged_in, sdk_stack, tmp_path):
    from tests.unit.platform.helpers import write_model_folder

    cli = logged_in
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "label": str(i + 1)}) + "\n" for i in range(8)))
    code, out, err = cli("datasets", "push", str(data), "--json")
    assert code == 0, err
    assert json.loads(out)["row_count"] == 8 and json.loads(out)["name"] == "sums"
    code, _, err = cli("datasets", "push", "missing.jsonl")
    assert code == 2 and err.strip() == "error: file: no such file missing.jsonl"
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1+1=", "label": "2"}\n{"prompt": oops}\n')
    code, _, err = cli("datasets", "push", str(broken))
    assert code == 1 and err.startswith("error: file: line 2:")

    reward_file = tmp_path / "exact.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return float(solution_str.strip() == ground_truth)\n"
    )
    code, out, err = cli("rewards", "push", "exact", str(reward_file))
    assert code == 0 and "(python)" in out, err
    code, out, err = cli("rewards", "push", "digits", "--builtin", "regex", "--spec", '{"pattern": "\\\\d+"}')
    assert code == 0, err
    code, _, err = cli("rewards", "push", "bad", "--builtin", "regex", "--spec", '{"pattern": "(", "nonsense": 1}')
    assert code == 1 and "error: spec." in err
    code, _, err = cli("rewards", "push", "bad", "--spec", "{not json")
    assert code == 2 and err.startswith("error: --spec: not valid JSON")

    folder = write_model_folder(tmp_path / "model")
    code, out, err = cli("models", "register", "tiny", str(folder))
    assert code == 0 and "LlamaForCausalLM" in out, err
    code, _, err = cli("models", "register", "nowhere", str(tmp_path / "nowhere"))
    assert code == 1 and err.startswith("error: path:")

    spec = tmp_path / "run.yaml"
    spec.write_text(
        textwrap.dedent(
            """\
            name: sums grpo
            model: tiny
            dataset: sums
            rewards: [exact, {reward: digits, weight: 0.5}]
            config:
              algorithm: {name: grpo}
              train: {steps: 3, lr: -1}
            """
        )
    )
    code, _, err = cli("experiments", "create", "-f", str(spec))
    assert code == 1 and "error: train.lr: Input should be greater than 0" in err
    spec.write_text(spec.read_text().replace("lr: -1", "lr: 0.001"))
    code, out, err = cli("experiments", "create", "-f", str(spec), "--json")
    assert code == 0, err
    experiment = json.loads(out)["experiment"]
    assert [r["weight"] for r in experiment["rewards"]] == [1.0, 0.5]
    code, _, err = cli("experiments", "create", "-f", str(tmp_path / "absent.yaml"))
    assert code == 2 and "no such file" in err
    spec.write_text(spec.read_text().replace("exact, ", "nope, "))
    code, _, err = cli("experiments", "create", "-f", str(spec))
    assert code == 1 and err.strip() == "error: reward: no reward named 'nope'"

    code, out, err = cli("runs", "launch", str(experiment["id"]), "--seed", "3", "--tag", "cli", "--json")
    assert code == 0, err
    run = json.loads(out)
    assert run["state"] == "queued" and run["seed"] == 3 and run["tags"] == ["cli"]
    code, out, _ = cli("runs", "ls", "--state", "queued", "--json")
    assert [r["id"] for r in json.loads(out)] == [run["id"]]
    code, out, _ = cli("runs", "ls")
    assert code == 0 and run["id"][:8] in out and run["id"] not in out and "sums grpo" in out
    code, out, _ = cli("runs", "ls", "--wide")
    assert code == 0 and run["id"] in out
    code, out, _ = cli("runs", "show", run["id"])
    assert code == 0 and "grpo" in out and "tiny" in out
    code, out, err = cli("runs", "clone", run["id"], "--seed", "4", "--json")
    assert code == 0 and json.loads(out)["seed"] == 4 and json.loads(out)["project_name"] == "default", err
    code, _, err = cli("projects", "create", "sums-again")
    assert code == 0, err
    code, out, err = cli("runs", "clone", run["id"], "--project", "sums-again", "--json")
    assert code == 0 and json.loads(out)["project_name"] == "sums-again", err  # its experiment copied there
    code, out, _ = cli("runs", "cancel", run["id"])
    assert code == 0 and "cancelled" in out  # still queued (no Ray here): nothing to stop, cancelled at once
    code, _, err = cli("runs", "launch", "999999")
    assert code == 1 and "error: " in err
    code, _, err = cli("runs", "show", "00000000-0000-0000-0000-000000000000")
    assert code == 1 and "No Run matches the given query." in err
    code, _, err = cli("runs", "resume", run["id"])
    assert code == 2 and err.strip() == f"error: checkpoint: run {run['id']} has no checkpoint left to resume from"

    code, _, err = cli("runs", "ledger", run["id"])
    assert code == 1 and "has no prompt ledger" in err
    ledger = PromptLedger(8)
    ledger.draw(1, [Draw(0, 3), Draw(0, 5)])
    ledger.resolve(
        1,
        [Draw(0, 3), Draw(0, 5)],
        [SampleOutcome(0, True, None, (0, 0)), SampleOutcome(1, False, "gibberish", (0, 0))],
    )
    run_folder = sdk_stack.storage / "runs" / run["id"]  # the engine would have made it (no Ray here: it never ran)
    run_folder.mkdir(parents=True, exist_ok=True)
    ledger.write_parquet(run_folder / LEDGER_FILE)
    code, out, err = cli("runs", "ledger", run["id"])
    assert code == 0 and "Prompt ledger" in out and "gibberish 1" in out, err
    code, _, err = cli("runs", "ledger", run["id"], "-o", str(tmp_path / "ledger.parquet"))
    assert code == 0, err
    assert sorted(pq.read_table(tmp_path / "ledger.parquet")["row"].to_pylist()) == [3, 5]


def test_projects_from_the_terminal_share_work_with_their_members_only(logged_in, web, token, tmp_path):
    import posttrain_sdk as posttrain
    from tests.unit.platform.helpers import a_researcher, write_model_folder

    ada = logged_in
    terminals = {}
    for name in ("grace", "mallory"):  # members of the default project, like ada
        a_researcher(name)
        (tmp_path / name).mkdir()
        terminals[name] = terminal_of(web, tmp_path / name)
        code, _, err = terminals[name]("login", "-u", name, "--password-stdin", stdin=PASSWORD + "\n")
        assert code == 0, err
    grace, mallory = terminals["grace"], terminals["mallory"]

    code, out, err = ada("projects", "create", "vision", "--description", "image captions")
    assert code == 0 and out.strip().endswith("vision (you are its owner)"), err
    code, out, err = ada("projects", "add", "vision", "grace", "member")
    assert code == 0 and out.strip() == "grace is member in vision", err
    data = tmp_path / "captions.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"describe {i}", "label": "cat"}) + "\n" for i in range(3)))
    code, out, err = ada("--project", "vision", "datasets", "push", str(data), "--json")
    assert code == 0 and json.loads(out)["project_name"] == "vision", err
    code, _, err = ada("datasets", "push", str(data))  # in two projects now: the server asks which
    assert (
        code == 1
        and err.strip() == "error: project: name the project to create in (you can create in: default, vision)"
    )

    code, out, err = grace("projects", "ls", "--json")
    assert code == 0 and {(p["name"], p["role"]) for p in json.loads(out)} == {
        ("default", "member"),
        ("vision", "member"),
    }
    code, out, _ = grace("--project", "vision", "datasets", "ls", "--json")
    assert [(d["name"], d["project_name"]) for d in json.loads(out)] == [("captions", "vision")]
    code, out, _ = grace("datasets", "ls")  # every project she reads: the table names each row's
    header, row = out.splitlines()
    assert header.split()[:3] == ["id", "name", "project"] and row.split()[1:3] == ["captions", "vision"]
    code, out, _ = mallory("datasets", "ls", "--json")
    assert code == 0 and json.loads(out) == []
    code, _, err = mallory("--project", "vision", "datasets", "ls")
    assert code == 1 and err.strip() == "error: project: no project named 'vision'"
    code, _, err = mallory("projects", "members", "vision")
    assert code == 1 and err.strip() == "error: project: no project named 'vision'"

    code, out, err = grace("projects", "use", "vision")
    assert code == 0 and out.strip() == f"default project on {web.url}: vision", err
    stored = json.loads((tmp_path / "grace" / "config" / "credentials.json").read_text())
    assert stored["servers"][web.url]["project"] == "vision"
    code, out, _ = grace("whoami")
    assert out.splitlines() == [f"grace (researcher) on {web.url}", "project: vision"]
    code, out, err = grace("rewards", "push", "exact", "--builtin", "exact_match", "--json")
    assert code == 0 and json.loads(out)["project_name"] == "vision", err  # into her default
    code, out, _ = grace("rewards", "ls")
    assert out.splitlines()[0].split() == ["id", "name", "kind", "spec"]  # one project: no project column
    code, out, _ = grace("projects", "use", "--clear")
    assert (
        code == 0
        and "project"
        not in json.loads((tmp_path / "grace" / "config" / "credentials.json").read_text())["servers"][web.url]
    )

    code, out, err = ada("datasets", "copy", "captions", "--to", "default", "--json")
    assert code == 0 and json.loads(out)["project_name"] == "default", err
    code, out, err = ada("rewards", "copy", "exact", "--to", "default", "--name", "exact-too")
    assert code == 0 and out.strip().endswith("exact-too in default"), err
    code, _, err = ada("--project", "vision", "models", "register", "tiny", str(write_model_folder(tmp_path / "m")))
    assert code == 0, err
    code, out, err = ada("models", "copy", "tiny", "--to", "default", "--json")
    assert code == 0 and json.loads(out)["project_name"] == "default", err
    code, out, err = ada("models", "ls")
    assert code == 0 and sorted(line.split()[2] for line in out.splitlines()[1:]) == ["default", "vision"], err

    run = posttrain.init("captions trl", project="vision", url=web.url, token=token, dir=tmp_path, heartbeat_s=0)
    run.log({"reward/mean": 0.5}, step=0)
    assert run.finish(timeout_s=30)
    (tracked,) = posttrain.Client(web.url, token, project="vision").runs.list()
    assert (tracked.id, tracked.project_name, tracked.experiment_name) == (run.id, "vision", "captions trl")
    assert posttrain.Client(web.url, token, project="default").runs.list() == []

    code, out, _ = ada("projects", "members", "vision", "--json")
    assert {(m["username"], m["role"]) for m in json.loads(out)} == {("ada", "owner"), ("grace", "member")}
    code, out, err = ada("projects", "remove", "vision", "grace")
    assert code == 0 and out.strip() == "grace is no longer in vision", err
    code, out, _ = grace("datasets", "ls", "--json")
    assert [d["project_name"] for d in json.loads(out)] == ["default"]  # the copy; vision's is out of her sight


def track_script(url: str, token: str, run_dir: Path, body: str) -> str:
    return textwrap.dedent(
        f"""\
        import os, sys, time
        import posttrain_sdk as posttrain
        run = posttrain.init("killed", "doomed", {{"lr": 1e-6}}, engine="python", url={url!r}, token={token!r},
                             dir={str(run_dir)!r}, heartbeat_s=0.2)
        print(run.id, flush=True)
        """
    ) + textwrap.dedent(body)


def test_an_external_run_tracked_with_the_sdk_lands_whole_and_is_followed_to_its_end(logged_in, web, token, tmp_path):
    import posttrain_sdk as posttrain

    run = posttrain.init(
        "gsm8k trl",
        "qwen-0.5b",
        {"learning_rate": 1e-6, "beta": 0.04},
        engine="trl",
        total_steps=20,
        url=web.url,
        token=token,
        dir=tmp_path / "runs",
        heartbeat_s=0.5,
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "posttrain_sdk", "--url", web.url, "runs", "follow", run.id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=logged_in.env,
    )
    for step in range(20):
        run.log({"reward/mean": step / 20, "kl/mean": 0.01 * step, "policy/entropy": 1.0 - step / 40}, step=step)
        run.log_samples(
            [
                {"prompt": f"{step}+{i}=", "response": str(step + i), "reward": float(i % 2), "group": 0}
                for i in range(4)
            ]
        )
        time.sleep(0.05)
    run.log_text("all done")
    assert run.finish(timeout_s=60)
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert f"run {run.id} succeeded" in out and "step 19/20 reward/mean=0.95" in out

    client = posttrain.Client(web.url, token)
    stored = client.runs.get(run.id)
    assert (stored.state, stored.kind, stored.engine, stored.last_step) == ("succeeded", "external", "trl", 19)
    series = client.runs.metrics(run.id, ["reward/mean"])["reward/mean"]
    assert series["steps"] == list(range(20)) and series["values"][-1] == pytest.approx(0.95)
    assert len(client.runs.samples(run.id)) == 80
    assert [s.index for s in client.runs.samples(run.id, step=7)] == [0, 1, 2, 3]
    code, out, _ = logged_in("runs", "ls", "--kind", "external", "--json")
    assert [r["id"] for r in json.loads(out)] == [run.id]
    code, out, _ = logged_in("runs", "logs", run.id)
    assert out.strip() == "[info] all done"
    code, _, err = logged_in("runs", "export", run.id, "-o", str(tmp_path / "m.csv"))
    assert code == 0, err
    lines = (tmp_path / "m.csv").read_text().splitlines()
    assert lines[0] == "step,time,kl/mean,policy/entropy,reward/mean" and len(lines) == 21
    code, _, err = logged_in("runs", "clone", run.id)
    assert code == 1 and "external run (trl) cannot be cloned" in err
    with pytest.raises(posttrain.PosttrainError, match="finished"):
        run.log({"x": 1})


def test_bad_tracking_input_names_the_field(web, token, tmp_path):
    import posttrain_sdk as posttrain

    with pytest.raises(posttrain.APIError) as refused:
        posttrain.init("p", engine="posttrain", url=web.url, token=token, dir=tmp_path)
    assert refused.value.fields == {"engine": "posttrain runs are launched from an experiment, not tracked"}
    run = posttrain.init("p", url=web.url, token=token, dir=tmp_path, heartbeat_s=0)
    with pytest.raises(TypeError, match=r"metrics\['loss'\]: must be a number, got str"):
        run.log({"loss": "high"})
    with pytest.raises(ValueError, match=r"rows\[1\]\.response: required"):
        run.log_samples([{"prompt": "a", "response": "b"}, {"prompt": "c"}])
    with pytest.raises(ValueError, match=r"rows\[0\]\.scroe: unknown field"):
        run.log_samples([{"prompt": "a", "response": "b", "scroe": 1}])
    with pytest.raises(ValueError, match="step: must be a non-negative integer"):
        run.log({"loss": 1.0}, step=-1)
    assert run.finish("failed", "gave up", timeout_s=30)
    assert posttrain.Client(web.url, token).runs.get(run.id).state_reason == "gave up"


def test_an_outage_of_the_web_server_loses_nothing(web, token, tmp_path):
    import posttrain_sdk as posttrain

    run = posttrain.init("outage", url=web.url, token=token, dir=tmp_path, heartbeat_s=0.2)
    for step in range(10):
        run.log({"reward/mean": float(step)}, step=step)
    web.stop()
    try:
        for step in range(10, 60):  # logged while nothing answers: they wait in the local file
            run.log({"reward/mean": float(step)}, step=step)
            run.log_samples([{"prompt": "p", "response": str(step), "reward": 1.0}])
        time.sleep(1.0)
    finally:
        web.start()
    assert run.finish(timeout_s=90)
    client = posttrain.Client(web.url, token)
    assert client.runs.metrics(run.id, ["reward/mean"])["reward/mean"]["steps"] == list(range(60))
    assert len(client.runs.samples(run.id)) == 50 and client.runs.get(run.id).state == "succeeded"


def test_undelivered_events_are_sent_later_with_sync(logged_in, web, token, tmp_path):
    import posttrain_sdk as posttrain

    run = posttrain.init("sync", url=web.url, token=token, dir=tmp_path / "runs", heartbeat_s=0)
    web.stop()
    try:
        for step in range(5):
            run.log({"reward/mean": 1.0}, step=step)
        assert run.finish(timeout_s=1) is False  # the process could end here; the events stay on disk
    finally:
        web.start()
    code, out, err = logged_in("sync", str(run.dir))
    assert code == 0 and "the server holds every event" in out, err
    assert posttrain.Client(web.url, token).runs.get(run.id).state == "succeeded"


def test_a_client_killed_mid_run_makes_the_run_lost(web, token, tmp_path, settings):
    from posttrain.runs.models import Run
    from posttrain.scheduling import services
    from tests.unit.platform.helpers import FakeJobs

    script = track_script(
        web.url,
        token,
        tmp_path,
        """\
        for step in range(3):
            run.log({"reward/mean": 0.5}, step=step)
        time.sleep(1.5)  # heartbeats go out meanwhile
        os.kill(os.getpid(), 9)  # no finish(), no atexit: as the OOM killer or a preempted node ends it
        """,
    )
    client = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert client.returncode == -signal.SIGKILL, client.stderr
    run_id = client.stdout.split()[0]
    run = Run.objects.get(pk=run_id)
    assert run.state == "running" and run.last_step == 2
    settings.RUN_HEARTBEAT_TIMEOUT_S = 2
    time.sleep(2.5)
    jobs = FakeJobs()
    services.runs_reconcile(jobs=jobs)  # what Celery beat runs every few seconds
    run.refresh_from_db()
    assert run.state == "failed" and run.state_reason.startswith("lost: the client sent nothing for 2s")
    assert jobs.stopped == [] and jobs.submitted == []
    assert (tmp_path / run_id / "events.jsonl").exists()


def test_posttrain_track_follows_event_files_and_verl_jsonl_while_they_are_written(logged_in, web, token, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    import posttrain_sdk as posttrain

    logdir = tmp_path / "openrlhf-tb"
    verl = tmp_path / "verl" / "gsm8k.jsonl"
    verl.parent.mkdir()

    def write_while_tracked() -> None:
        writer = SummaryWriter(str(logdir / "run-1"), flush_secs=3600)
        with verl.open("w") as f:
            for step in range(1, 6):
                writer.add_scalar("train/reward", step / 10, step)
                writer.add_scalar("train/policy_loss", -step / 100, step)
                writer.flush()
                f.write(
                    json.dumps({"step": step, "data": {"critic/score/mean": step / 5, "actor/entropy": 0.9}}) + "\n"
                )
                f.flush()
                time.sleep(0.4)
        writer.close()

    writer = threading.Thread(target=write_while_tracked)
    writer.start()
    common = ("--idle-timeout", "4", "--poll", "0.3")
    tb = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "posttrain_sdk",
            "--url",
            web.url,
            "track",
            str(logdir),
            "--experiment",
            "openrlhf",
            *common,
        ],
        env=logged_in.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    code, _, err = logged_in(
        "--project", "default", "track", str(verl), "--experiment", "verl", "--total-steps", "5", *common
    )
    writer.join()
    assert code == 0, err
    _, tb_err = tb.communicate(timeout=120)
    assert tb.returncode == 0, tb_err
    client = posttrain.Client(web.url, token)
    (verl_run,) = client.runs.list(kind="external", search="verl")
    assert verl_run.engine == "verl" and verl_run.state == "succeeded" and verl_run.total_steps == 5
    assert client.runs.metrics(verl_run.id, ["reward/mean"])["reward/mean"]["values"] == pytest.approx(
        [0.2, 0.4, 0.6, 0.8, 1.0]
    )
    (tb_run,) = client.runs.list(kind="external", search="openrlhf")
    assert tb_run.engine == "openrlhf" and tb_run.experiment_name == "openrlhf" and tb_run.project_name == "default"
    metrics = client.runs.metrics(tb_run.id, ["reward/mean", "policy/loss"])
    assert metrics["reward/mean"]["steps"] == [1, 2, 3, 4, 5] and metrics["policy/loss"]["values"][0] == pytest.approx(
        -0.01
    )
    code, _, err = logged_in("track", str(tmp_path / "notes.txt"), "--experiment", "x")
    assert code == 2 and "--format" in err


def test_the_sdk_reads_metrics_series_and_review_exports(web, token, tmp_path):
    import posttrain_sdk as posttrain

    client = posttrain.Client(web.url, token)
    run = client.runs.track("reads", heartbeat_s=0, dir=tmp_path)
    for step in range(5):
        run.log({"reward/mean": step * 0.1}, step=step)
    run.finish(timeout_s=30)
    series = client.runs.series(run.id, ["reward/mean"], max_points=100)
    assert series["series"]["reward/mean"]["step"] == [0, 1, 2, 3, 4]
    with pytest.raises(posttrain.NotFound):
        client.review.export(424242, tmp_path / "pairs.jsonl")


def readme_block(section: str, language: str, index: int = 0) -> str:
    """The `index`-th ```language block of a README section, as a reader would copy it."""
    text = (REPO_ROOT / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return body.split(f"```{language}\n")[index + 1].split("```", 1)[0]


def test_the_readmes_python_examples_work_as_pasted(logged_in, web, token, tmp_path):
    from tests.unit.platform.helpers import write_model_folder

    cli = logged_in
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "label": str(i + 1)}) + "\n" for i in range(4)))
    terminal = readme_block("Use from Python and the terminal", "bash")
    for line in terminal.splitlines()[1:4]:  # datasets push, rewards push, models register (a real folder here)
        args = line.split("#")[0].split()[1:]
        if args[:2] == ["models", "register"]:
            args[-1] = str(write_model_folder(tmp_path / "model"))
        code, _, err = cli(*args)
        assert code == 0, (line, err)
    env = {**cli.env, "POSTTRAIN_URL": web.url, "POSTTRAIN_TOKEN": token}
    client_example = readme_block("Use from Python and the terminal", "python")
    done = subprocess.run([sys.executable, "-c", client_example], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "{'train.lr': 'Input should be greater than 0'}" in done.stdout

    code, _, err = cli("projects", "create", "my-project")  # the project the tracking example names
    assert code == 0, err
    tracking_example = readme_block("Track a TRL / OpenRLHF / verl run", "python")
    done = subprocess.run(
        [sys.executable, "-c", tracking_example], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    import posttrain_sdk as posttrain

    (run,) = posttrain.Client(web.url, token).runs.list(kind="external", search="baseline")
    assert (run.state, run.last_step, run.total_steps) == ("succeeded", 99, 100)
    assert (run.experiment_name, run.project_name) == ("gsm8k-grpo", "my-project")
    assert (tmp_path / "posttrain-runs" / run.id / "events.jsonl").exists()


def test_a_tinker_session_is_a_run_of_its_tokens_user_with_curves_rollouts_and_checkpoints(
    web, token, tiny_demo, tmp_path
):
    """The official tinker SDK with a Posttrain token as its key: each training client is an external run of that
    user; a run cancelled in Posttrain ends its training client with that reason; a token Posttrain refuses is
    refused."""
    import tinker
    from tinker import types

    import posttrain_sdk as posttrain
    from rl_engine.tinker.server import TinkerServer
    from rl_engine.tinker.service import TinkerService
    from rl_engine.tinker.tracking import PosttrainRuns

    service = TinkerService(
        {"demo": tiny_demo / "model"}, tmp_path / "tinker", runs=PosttrainRuns(web.url, tmp_path / "runs")
    )
    server = TinkerServer(("127.0.0.1", 0), service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = tinker.ServiceClient(base_url=server.url, api_key=f"tml-{token}")
        training = client.create_lora_training_client(base_model="demo", rank=4).result()
        tokens = training.get_tokenizer().encode("12+30=42")
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        for _ in range(2):
            training.forward_backward([datum], loss_fn="cross_entropy").result()
            training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        sampler = training.save_weights_and_get_sampling_client(name="two-steps")
        params = types.SamplingParams(max_tokens=4, seed=0)
        sampler.sample(types.ModelInput.from_ints(tokens[:4]), num_samples=3, sampling_params=params).result()
        training.save_state("kept").result()

        api = posttrain.Client(web.url, token)
        [run] = [r for r in api.runs.list(kind="external") if r.engine == "tinker"]
        assert run.state == "running"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(api.runs.samples(run.id)) < 3:
            time.sleep(0.5)
        series = api.runs.metrics(run.id, ["loss/sum", "optim/lr"])
        assert series["loss/sum"]["steps"] == [0, 1] and series["optim/lr"]["values"] == [1e-3, 1e-3]
        assert {s.prompt for s in api.runs.samples(run.id)} == {training.get_tokenizer().decode(tokens[:4])}
        assert [c["path"] for c in api.runs.checkpoints(run.id)] == [f"tinker://{training.model_id}/weights/kept"]
        assert f"weights saved for sampling: tinker://{training.model_id}/sampler_weights/" in api.runs.logs(run.id)

        api.runs.cancel(run.id)
        # The service reads the run's state at most every STATE_CACHE_S (2 s): calls end within that.
        with pytest.raises(Exception, match="was cancelled in Posttrain"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                training.forward_backward([datum], loss_fn="cross_entropy").result()
                time.sleep(0.5)

        client.close("success").result()
        with (
            pytest.raises(Exception, match="401|does not accept this token"),
            tinker.ServiceClient(base_url=server.url, api_key="tml-not-a-posttrain-token") as stranger,
        ):
            stranger.create_lora_training_client(base_model="demo", rank=4).result()
    finally:
        server.shutdown()
        server.server_close()
