"""Helpers of tests/security that are not fixtures: the planted secrets' marker and the resolver's refusals,
the world (`World`, which conftest.py's `world` fixture builds), the test user's API client that keeps every
answer, the checks that the stack stayed up, and registry rows inside the import root."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.support.stack import PlatformStack, free_port

SECRET_MARK = f"PLANTED-{secrets.token_hex(6)}"
OUTSIDE = "is outside the server folders an admin opened for imports (POSTTRAIN_IMPORT_ROOTS)"
PRIVATE = "is one of the platform's own files or folders, which no path may name"
SOFT_LIMIT_S, HARD_LIMIT_S = 8, 12


@dataclass
class World:
    home: Path
    imports: Path
    targets: dict[str, Path]  # what a hostile path names: the planted secrets and the host's own files
    reward_server_port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)

    @property
    def storage(self) -> Path:
        return self.home / "storage"

    def link_to(self, name: str) -> Path:
        return self.imports / "links" / name

    def expected_refusal(self, named: Path) -> str:
        """The resolver's message for a path naming `named` (directly or through a link)."""
        real = Path(os.path.realpath(named))
        return f"{named} {PRIVATE if real.is_relative_to(self.home) else OUTSIDE}"

    def assert_never_quoted(self, *texts: str) -> None:
        """No planted secret, no line of the host's passwd, not the secret key the servers' environment holds
        (what /proc/self/environ would give)."""
        from django.conf import settings

        for text in texts:
            assert SECRET_MARK not in text
            assert "root:x:0:0" not in text
            assert settings.SECRET_KEY not in text


class Api:
    """A signed-in API client (token auth, as the CLI and scripts use it) that keeps every answer's text."""

    def __init__(self, base: str, token: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        self.seen: list[str] = []

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        response = self.session.request(method, f"{self.base}{path}", timeout=120, **kwargs)
        self.seen.append(response.text)
        return response

    def post(self, path: str, body: dict | None = None, **kwargs) -> requests.Response:
        return self.request("POST", path, json=body, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self.request("GET", path, **kwargs)


def api_for(stack: PlatformStack, username: str, *, server_paths: bool = False) -> Api:
    """A researcher's API client; `server_paths`: an admin granted them naming files on the server."""
    from rest_framework.authtoken.models import Token

    from tests.unit.platform.helpers import a_researcher, grant_server_paths

    user = a_researcher(username)
    if server_paths:
        grant_server_paths(user)
    return Api(stack.web.url, Token.objects.create(user=user).key)


def assert_stack_alive(stack: PlatformStack) -> None:
    """The web server and both workers still run, and the web still answers."""
    assert stack.web.process.poll() is None
    assert stack.worker.poll() is None and stack.user_code_worker.poll() is None
    assert requests.get(f"{stack.web.url}/api/health/", timeout=30).status_code in (200, 503)


def server_logs(stack: PlatformStack) -> list[str]:
    return [stack.web.log(), stack.worker_log.read_text(), stack.user_code_log.read_text()]


SMALL_RUN = {
    "algorithm": {"name": "grpo"},
    "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
    "train": {"steps": 1, "micro_batch_size": 4},
    "logging": {"eval_every": 0},
}


def registry_rows(world: World, tag: str) -> dict:
    """A model folder, a dataset and a builtin reward inside the import root (legitimate ones), by the ORM."""
    from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
    from tests.unit.platform.helpers import write_model_folder

    data = world.imports / "prompts.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    return {
        "model": ModelAsset.objects.create(name=f"model {tag}", path=str(write_model_folder(world.imports / "model"))),
        "dataset": Dataset.objects.create(
            name=f"data {tag}", sha256=tag[:1] * 64, format="jsonl", path=str(data), size_bytes=1, row_count=1
        ),
        "reward": RewardFunction.objects.create(name=f"exact {tag}", kind="builtin", spec={"type": "exact_match"}),
    }


def experiment_body(rows: dict, name: str, config: dict | None = None) -> dict:
    """A POST /api/experiments/ (or validate) body over `registry_rows`."""
    return {
        "name": name,
        "model": rows["model"].pk,
        "dataset": rows["dataset"].pk,
        "rewards": [{"reward": rows["reward"].pk, "weight": 1.0}],
        "config": {**SMALL_RUN, **(config or {})},
    }
