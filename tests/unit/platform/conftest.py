"""The platform's unit-test fixtures: users by role, API clients signed in as them, every test's own
storage root, a tiny real Hugging Face model folder, and reward trials run in this process. The rows
most tests start from (`researcher`, `registry`, `experiment`, `storage`, `no_dispatch`) are in
tests/conftest.py, shared with the e2e tests; helpers that are not fixtures in helpers.py here."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tests.unit.platform.helpers import PASSWORD, join


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """Django's PBKDF2 takes ~0.4 s a password on this machine, paid for every user a test makes; these
    tests never leave this process, where a cheap hasher checks what it made (Django's own advice for
    test suites). The integration and e2e servers keep the real one."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def storage(storage: Path) -> Path:
    """Every platform test writes artifacts (datasets, rewards, model copies) under its own folder."""
    return storage


@pytest.fixture
def make_user(db) -> Callable:
    """make_user("researcher") -> a user with that role (admin, researcher, annotator)."""
    from posttrain.accounts.services import user_create

    def make(role: str, username: str | None = None):
        user = user_create(username or f"{role}-user", PASSWORD, role)
        # A researcher works in the default project, where the tests' rows are.
        return join(user, "member") if role == "researcher" else user

    return make


@pytest.fixture
def client_for(make_user) -> Callable[[str], APIClient]:
    """client_for("annotator") -> an APIClient signed in (session) as a user of that role;
    client_for("anonymous") -> one that is not signed in."""

    def make(role: str) -> APIClient:
        client = APIClient()
        if role != "anonymous":
            client.force_login(make_user(role))
        return client

    return make


@pytest.fixture
def researcher_client(researcher) -> APIClient:
    """An APIClient signed in (session) as the `researcher`."""
    client = APIClient()
    client.force_login(researcher)
    return client


@pytest.fixture
def api(client, researcher):
    """Django's test client signed in as the `researcher` (posts JSON with helpers.post)."""
    client.force_login(researcher)
    return client


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (tiny, random) Qwen2 model folder: config.json, model.safetensors, tokenizer."""
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("tiny-model")
    build_demo(out, seed=0, model_size="tiny", sft_steps=0, progress=False)
    return out / "model"


@pytest.fixture(autouse=True)
def trials_run_here(monkeypatch):
    """A reward's "Try it" and a new reward's import check go to a Celery worker after commit; these tests
    run inside one transaction, so the worker's service runs right away in this process instead (its
    code still runs in the sandbox). tests/integration/test_try_it_sandbox.py runs them on a real worker."""
    trials = importlib.import_module("posttrain.registry.services.reward_try")
    monkeypatch.setattr(trials, "_dispatch", lambda trial, wait_s: trials.reward_trial_run(trial.pk))


@pytest.fixture(autouse=True)
def probes_run_here(monkeypatch):
    """A reward probe goes to the user-code worker after commit; here the worker's service runs right away in
    this process (the reward's code still runs in the sandbox), like the trials above."""
    probes = importlib.import_module("posttrain.registry.services.reward_probes")
    monkeypatch.setattr(probes, "_dispatch", lambda probe: probes.reward_probe_run(probe.pk))
