"""Shared fixtures. Expensive servers (a Ray head, the ASGI web server) are started once per session; the
helpers that start them are in tests/support/stack.py."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.stack import REPO_ROOT, RayHead, make_ray_token_file, redis_url_for_worker

pytest_plugins = ["tests.support.every_test_reported"]

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A GGUF import's vLLM check takes a minute: off in every stack the tests start (unit tests set it themselves).
os.environ.setdefault("POSTTRAIN_GGUF_CHECK_VLLM", "0")
# `model.dtype: auto` is float32 for the whole suite (and every engine it starts): the machines of this kind differ
# in bf16 support, and the suite's numbers must not (rl_engine/host_dtype.py; tests/unit/engine/test_devices.py
# checks auto itself).
os.environ.setdefault("POSTTRAIN_AUTO_DTYPE", "float32")

# Every Ray cluster of the session runs with token authentication, as the platform's own does, on one token of the
# session's: the heads and nodes the tests start (tests/support/stack.py, ray_node_env), the local clusters the
# engine's tests start in this process (Ray reads RAY_AUTH_TOKEN_PATH; without it Ray would write a token into the
# home folder), and the platform's stacks, which copy this environment (POSTTRAIN_RAY_TOKEN_FILE).
RAY_TOKEN_FILE = make_ray_token_file()
os.environ.pop("RAY_AUTH_TOKEN", None)
os.environ.update(
    RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(RAY_TOKEN_FILE), POSTTRAIN_RAY_TOKEN_FILE=str(RAY_TOKEN_FILE)
)

# Each pytest-xdist worker (`make test` runs two) gets a Redis database of its own: the stacks of two
# workers would otherwise share the `celery` queue, and one worker's Celery process would run the other's
# tasks against a test database it cannot see. Set before any stack copies the environment.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...; "" without xdist

for _name in ("REDIS_URL", "CELERY_BROKER_URL"):
    if XDIST_WORKER and os.environ.get(_name):
        os.environ[_name] = redis_url_for_worker(os.environ[_name], XDIST_WORKER)


@pytest.fixture(scope="session", autouse=True)
def flush_retries_a_deadlock() -> Iterator[None]:
    """A transactional test ends with a flush of the test database (TRUNCATE of every table) while its module's
    live stack (a Celery worker with beat) may be inside a transaction of its own. TRUNCATE's exclusive locks can
    deadlock with that transaction's reads, and Postgres then aborts the flush, which leaves the rows to the next
    test. The flush is tried again: by then the other transaction has ended."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    original = flush.Command.handle
    attempts = 3

    def handle(self, *args, **options):
        for attempt in range(1, attempts + 1):
            try:
                return original(self, *args, **options)
            except CommandError as exc:
                if attempt == attempts or "deadlock detected" not in str(exc.__cause__):
                    raise
                time.sleep(1.0)
        return None

    flush.Command.handle = handle
    try:
        yield
    finally:
        flush.Command.handle = original


@pytest.fixture(scope="session", autouse=True)
def ray_token_for_tests() -> Path:
    """This process's settings were read before this file (pytest-django sets Django up first): they take the
    session's Ray token too, so the platform's code under test reaches the session's Ray clusters."""
    from django.conf import settings

    settings.RAY_AUTH_MODE = "token"
    settings.RAY_TOKEN_FILE = RAY_TOKEN_FILE
    return RAY_TOKEN_FILE


@pytest.fixture(scope="session", autouse=True)
def import_roots_for_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests register server files (models, datasets, reward files) from their own temporary folders: the
    session's base temp folder is the import root of this process and of every stack a test starts (the
    tests of the roots themselves, tests/security, set their own)."""
    from django.conf import settings

    root = tmp_path_factory.getbasetemp().resolve()
    os.environ["POSTTRAIN_IMPORT_ROOTS"] = str(root)
    settings.IMPORT_ROOTS = [root]
    return root


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by folder, so `-m "not integration"` and friends work without decorators. Give each
    schemathesis case a node id of its own: schemathesis (4.32, on pytest 9) names the item after its operation but
    leaves every one the bare function's node id, and pytest-xdist, which schedules by node id, then runs only the
    first operation of tests/unit/platform/test_api_fuzz.py and silently drops the rest."""
    for item in items:
        if type(item).__name__ == "SchemathesisFunction" and not item.nodeid.endswith("]"):
            item._id = item.parent.id.child(item.name)
        parts = Path(str(item.fspath)).relative_to(REPO_ROOT).parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "e2e" in parts:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def ray_head_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """The session's Ray head, for a test that crashes and restarts it; most tests want `ray_head`."""
    head = RayHead(tmp_path_factory.mktemp("ray") / "ray-head.log")
    head.start()
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="session")
def ray_head(ray_head_server: RayHead) -> str:
    """A real local Ray head for the session; its dashboard (Jobs API) address."""
    return ray_head_server.address


# --- the engine's tiny demo task, shared by the engine's unit tests and the GPU tests ---------------------


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny demo task (Qwen2 architecture, trained tokenizer, a few supervised steps), built once."""
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("tiny-demo")
    # A few supervised steps only: the policy must emit varied digit strings so rewards differ
    # within a group and the updates are not all zero.
    build_demo(out, seed=0, model_size="tiny", sft_steps=10, progress=False)
    return out


# --- platform rows, shared by the platform's unit tests and the e2e tests -------------------------------
# Helpers that are not fixtures live in tests/unit/platform/helpers.py.


@pytest.fixture
def researcher(db):
    """The signed-in user of most platform tests: "ada", with the researcher role, a maintainer of the default
    project (she writes the rows tests make through the ORM, which have no creator; the tests of ownership make
    members of their own)."""
    from tests.unit.platform.helpers import a_researcher

    return a_researcher(role="maintainer")


@pytest.fixture
def storage(settings, tmp_path: Path) -> Path:
    """The test's own artifact root (settings.STORAGE_ROOT): run folders, datasets, rewards, model copies."""
    settings.STORAGE_ROOT = tmp_path / "storage"
    settings.ROLLOUT_STORE = str(settings.STORAGE_ROOT)  # rollout files (posttrain.telemetry.rollouts) too
    return settings.STORAGE_ROOT


@pytest.fixture
def registry(db, tmp_path: Path) -> dict:
    """Registry rows straight through the ORM (helpers.registry_rows): a model folder that exists, a stored
    JSONL dataset of 8 sums, and two builtin rewards ("exact", "format")."""
    from posttrain.registry.models import RewardFunction
    from tests.unit.platform.helpers import registry_rows

    rows = registry_rows(tmp_path, [(f"{i}+1=", str(i + 1)) for i in range(8)])
    rows["format"] = RewardFunction.objects.create(
        name="two-digits", kind="builtin", spec={"type": "regex", "pattern": r"^\d\d"}
    )
    return rows


@pytest.fixture
def experiment(registry, researcher):
    """The researcher's GRPO experiment over the `registry` rows (helpers.BASE_CONFIG)."""
    from posttrain.runs import services
    from tests.unit.platform.helpers import BASE_CONFIG, default_project

    return services.experiment_create(
        project=default_project(),
        name="sums grpo",
        model=registry["model"],
        dataset=registry["dataset"],
        rewards=[(registry["exact"], 1.0), (registry["format"], 0.5)],
        config=BASE_CONFIG,
        user=researcher,
    )


@pytest.fixture
def no_dispatch(monkeypatch) -> list[tuple[str, str]]:
    """Records the Celery tasks the services would send for a run (after commit) instead of sending them."""
    from posttrain.core import dispatch

    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(dispatch, "run_task", lambda name, run_id: sent.append((name, str(run_id))))
    return sent
