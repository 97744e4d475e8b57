"""The fixtures of the test modules that run the real stack (tests/integration/test_run_lifecycle.py,
test_scheduler.py, test_scheduler_multinode.py, and tests/faults through its conftest): a module imports the
ones it uses explicitly,

    from tests.support.stack_fixtures import api, demo_assets, registry, stack  # noqa: F401  (fixtures)

so each module gets its own module-scoped stack and demo task (a module or package may define its own
instead, as tests/faults/conftest.py does). `check_after_test` is what such a module checks after each of its
tests, from an autouse fixture of its own: never an autouse fixture here, which every importer would run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api import Api
from tests.support.stack import PlatformStack, platform_stack, postgres_url, stop_ray_jobs, tiny_demo_assets


@pytest.fixture(scope="module")
def demo_assets(tmp_path_factory) -> Path:
    return tiny_demo_assets(tmp_path_factory, "tiny-demo")


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, ray_head, tmp_path_factory) -> Iterator[PlatformStack]:
    from django.db import connection

    with platform_stack(
        ray_head, tmp_path_factory.mktemp("runs-stack"), postgres_url(connection.settings_dict)
    ) as stack:
        yield stack


@pytest.fixture
def api(stack) -> Api:
    from rest_framework.authtoken.models import Token

    from tests.unit.platform.helpers import a_researcher

    return Api(stack.web.url, Token.objects.create(user=a_researcher()).key)


@pytest.fixture
def registry(demo_assets, tmp_path):
    """Registry rows for the demo task, straight through the ORM (the registry API is tested elsewhere)."""
    from posttrain.registry.models import Dataset, ModelAsset, RewardFunction

    train = demo_assets / "data" / "train.jsonl"
    raising = tmp_path / "raising_reward.py"
    raising.write_text(
        "def reward_func(queries, prompts, labels, **kwargs):\n    raise RuntimeError('the reward server exploded')\n"
    )
    broken = tmp_path / "broken_reward.py"
    broken.write_text("def reward_func(queries, prompts, labels, **kwargs)\n    return [0.0] * len(queries)\n")
    return {
        "model": ModelAsset.objects.create(name="tiny demo", path=str(demo_assets / "model")),
        "dataset": Dataset.objects.create(
            name="sums",
            sha256="0" * 64,
            format="jsonl",
            path=str(train),
            size_bytes=train.stat().st_size,
            row_count=5000,
            prompt_field="prompt",
            label_field="label",
            columns=["prompt", "label"],
        ),
        "exact": RewardFunction.objects.create(name="correct", kind="builtin", spec={"type": "exact_match"}),
        "format": RewardFunction.objects.create(
            name="two_digits", kind="builtin", spec={"type": "regex", "pattern": r"^\d\d"}
        ),
        "raising": RewardFunction.objects.create(
            name="raising", kind="python", spec={"type": "python", "path": str(raising), "timeout_s": 10}
        ),
        "broken": RewardFunction.objects.create(
            name="broken", kind="python", spec={"type": "python", "path": str(broken)}
        ),
    }


def check_after_test(stack: PlatformStack, api: Api) -> None:
    """No request may have been a 500; a failed test must not leave a run going into the next one (its
    events and the worker's admission of what it left queued would race the database's flush)."""
    api.cancel_unfinished()
    stop_ray_jobs(stack.ray)
    errors = [line for line in stack.web.log().splitlines() if '" 500 ' in line]
    stack.web.log_path.write_text("")  # each test checks its own requests
    assert not errors, "\n".join(errors)
