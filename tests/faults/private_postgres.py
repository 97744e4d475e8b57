"""A private Postgres cluster for the test that stops the database: the system Postgres serves every
other test and developer on the machine, so an outage is staged on a cluster of our own (initdb + pg_ctl
in a temporary folder, on a free port), migrated and seeded through Django like a fresh install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.stack import REPO_ROOT, free_port


def postgres_bindir() -> Path:
    """Where initdb and pg_ctl live (Debian keeps them out of PATH, under /usr/lib/postgresql/<v>/bin)."""
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        bindir = Path(
            subprocess.run([pg_config, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
        )
        if (bindir / "initdb").exists():
            return bindir
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        pytest.skip("no Postgres server binaries (initdb, pg_ctl) on this machine")
    return found[-1].parent


class PrivatePostgres:
    """One cluster on 127.0.0.1:`port`. Postgres refuses to run as root, so as root it runs as the
    `postgres` user (the folder is handed to it). `stop()` is a fast shutdown: open connections are cut,
    as clients see a crash of the server; `start()` brings it back on the same address and data."""

    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        self.folder = Path(tempfile.mkdtemp(prefix="pt-faults-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def url(self, database: str = "posttrain") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _pg(self, tool: str, *args: str) -> None:
        result = subprocess.run(
            [*self._as, str(self.bindir / tool), *args], check=False, capture_output=True, text=True
        )
        if result.returncode != 0:
            log = (self.folder / "postgres.log").read_text()[-2000:] if (self.folder / "postgres.log").exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {result.stdout}{result.stderr}\n{log}")

    def init(self) -> None:
        if self._as:
            shutil.chown(self.folder, "postgres", "postgres")
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "postgres.log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)

    def create_database(self, name: str = "posttrain") -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url()) as conn:
            return conn.execute(sql, params).fetchall()


SEEDED_PASSPHRASE = "a-long-test-passphrase"  # the seeded researcher `ada`'s, to sign in to pages

_SEED = """
import json, sys
from posttrain.accounts.services import token_get_or_create, user_create
from posttrain.projects.models import Membership, default_project_id
from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
assets = json.loads(sys.stdin.read())
ada = user_create("ada", assets["passphrase"], "researcher")
Membership.objects.create(project_id=default_project_id(), user=ada, role="member")
token = token_get_or_create(ada).key
model = ModelAsset.objects.create(name="tiny demo", path=assets["model"])
dataset = Dataset.objects.create(name="sums", sha256="0" * 64, format="jsonl", path=assets["train"],
    size_bytes=assets["train_bytes"], row_count=5000, prompt_field="prompt", label_field="label",
    columns=["prompt", "label"])
exact = RewardFunction.objects.create(name="correct", kind="builtin", spec={"type": "exact_match"})
print("SEEDED " + json.dumps({"token": token, "model": model.pk, "dataset": dataset.pk, "exact": exact.pk}))
"""


def migrate_and_seed(database_url: str, demo_assets: Path) -> dict[str, Any]:
    """A fresh install on `database_url`: migrated, one researcher, the demo task's registry rows.
    Returns the researcher's API token and the rows' ids."""
    env = {**os.environ, "DATABASE_URL": database_url}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], cwd=REPO_ROOT, env=env, check=True)
    train = demo_assets / "data" / "train.jsonl"
    assets = {"model": str(demo_assets / "model"), "train": str(train), "train_bytes": train.stat().st_size}
    assets["passphrase"] = SEEDED_PASSPHRASE
    seeded = subprocess.run(
        [*manage, "shell", "-c", _SEED],
        cwd=REPO_ROOT,
        env=env,
        input=json.dumps(assets),
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in seeded.stdout.splitlines() if x.startswith("SEEDED "))
    return json.loads(line.split(" ", 1)[1])
