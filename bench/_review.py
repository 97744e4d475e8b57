"""What the review benches share (review_speed.py, judge_agreement.py): this process pointed at a fresh
Postgres database, and a run of the demo task's prompts with seeded responses, ingested the way the engine
sends them (posttrain.telemetry.ingestion.events_ingest).

The responses stand in for a policy partway through training, each of a kind whose truth a person sees
at once and an exact-match verifier does not always: the right sum; a wrong sum; the right sum in words
("eighty-five": right, but holds no number); the right sum followed by a stray number ("85, checked in 2
steps": right, but its last number is 2); a wrong sum that ends by quoting the right one ("86, not 85":
wrong, but its last number is right)."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._servers import Server

REPO = Path(__file__).resolve().parents[1]
KINDS = {"right": 0.45, "wrong": 0.40, "words": 0.05, "stray_number": 0.05, "quotes_the_right_one": 0.05}
RIGHT_KINDS = frozenset({"right", "words", "stray_number"})
_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def in_words(n: int) -> str:
    """0..999 in English words ("one hundred twenty-three")."""
    if n >= 100:
        rest = n % 100
        return f"{_ONES[n // 100]} hundred" + (f" {in_words(rest)}" if rest else "")
    if n >= 20:
        return _TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else "")
    return _TEENS[n - 10] if n >= 10 else _ONES[n]


def demo_rollouts(n: int, seed: int) -> list[dict[str, Any]]:
    """n rollouts of the demo task (two-digit addition, its RL prompts): prompt, label, response, kind, right."""
    sys.path.insert(0, str(REPO))
    from rl_engine.demo import task

    pairs = task.split_pairs(seed=0, n_train=n, n_test=1, n_sft=1).train
    rng = random.Random(seed)
    rollouts = []
    for a, b in pairs:
        total = a + b
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        off = total + rng.choice([-10, -2, -1, 1, 2, 10])
        response = {
            "right": str(total),
            "wrong": str(off),
            "words": in_words(total),
            "stray_number": f"{total}, checked in {rng.randint(2, 9)} steps",
            "quotes_the_right_one": f"{off}, not {total}",
        }[kind]
        rollouts.append(
            {
                "prompt": task.format_prompt(a, b),
                "label": task.format_answer(a, b),
                "response": response,
                "kind": kind,
                "right": kind in RIGHT_KINDS,
            }
        )
    return rollouts


def pg_admin(pg_url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{pg_url.rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def fresh_database(pg_url: str, db: str) -> str:
    pg_admin(pg_url, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    pg_admin(pg_url, f'CREATE DATABASE "{db}"')
    return f"{pg_url.rstrip('/')}/{db}"


def drop_database(pg_url: str, db: str) -> None:
    pg_admin(pg_url, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def tear_down(pg_url: str, db: str, workdir: Path, servers: list[Server | None], log: Callable[[str], None]) -> None:
    """Stop the bench's servers, drop its database, remove its folder."""
    for server in servers:
        if server is not None:
            server.stop()
    if "django" in sys.modules:
        from django.db import connections

        connections.close_all()
    try:
        drop_database(pg_url, db)
    except Exception as exc:
        log(f"could not drop {db}: {exc}")
    shutil.rmtree(workdir, ignore_errors=True)


def django_setup(database_url: str, workdir: Path, redis_url: str | None) -> dict[str, str]:
    """Point this process at the database, migrate it, and return the environment servers get too."""
    for key in ("REDIS_URL", "CELERY_BROKER_URL"):
        os.environ.pop(key, None)
    os.environ.update(
        DATABASE_URL=database_url,
        POSTTRAIN_HOME=str(workdir / "posttrain-home"),
        POSTTRAIN_SECRET_KEY=secrets.token_urlsafe(40),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="posttrain.settings",
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "platform"), str(REPO / "sdk")]),
    )
    if redis_url:
        os.environ.update(REDIS_URL=redis_url, CELERY_BROKER_URL=redis_url)
    sys.path[:0] = [str(REPO / "platform"), str(REPO), str(REPO / "sdk")]
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    return dict(os.environ)


def campaign_owner() -> tuple[Any, Any]:
    """The user who makes the bench's campaign (an admin: they read every run) and the project it goes in."""
    from posttrain.accounts.services import user_create
    from posttrain.projects.models import Project, default_project_id

    return user_create("bench-owner", "a-long-bench-passphrase", "admin"), Project.objects.get(pk=default_project_id())


def run_with_rollouts(rollouts: list[dict[str, Any]], step: int = 1) -> Any:
    """A running run of the demo task whose one samples event (step `step`) holds the rollouts, ingested."""
    from posttrain.registry.models import Dataset, ModelAsset
    from posttrain.runs.models import Experiment, Run, RunState
    from posttrain.telemetry.ingestion import events_ingest
    from posttrain.telemetry.rollouts import rollout_folder
    from posttrain_sdk import rollout_files

    model = ModelAsset.objects.create(name="bench-review", path="/nonexistent")
    data = Dataset.objects.create(
        name="bench-review", sha256="0" * 64, format="jsonl", path="/nonexistent", size_bytes=0, row_count=0
    )
    experiment = Experiment.objects.create(name="bench review", model=model, dataset=data, config={})
    run = Run.objects.create(experiment=experiment, name="bench review", state=RunState.RUNNING)
    samples = [
        {
            "index": i,
            "group": i,
            "prompt": r["prompt"],
            "response": r["response"],
            "label": r["label"],
            "reward": 1.0 if r["response"] == r["label"] else 0.0,
            "components": {},
            "advantage": 0.0,
            "length": len(r["response"]),
            "finish_reason": "stop",
            "errors": [],
            "kept": True,
        }
        for i, r in enumerate(rollouts)
    ]
    # The step's rollouts as the engine stores them: one Parquet file in the run's folder, the event naming it.
    table = rollout_files.rows_table(samples, step)
    stored = rollout_files.write_step(rollout_folder(run.id), table, step=step)
    event = {
        "run": str(run.id),
        "seq": 1,
        "type": "samples",
        "step": step,
        "time": time.time(),
        "data": stored.event_data(),
    }
    events_ingest(run.id, [event])
    return run
