"""Every hostile program of tests/hostile_programs.py through a python reward's "Try it" on the real stack
(uvicorn, a Celery worker, Postgres, Redis): the code runs on the worker in the sandbox, never in the
web server's process tree; each is contained, and the web server and the worker keep running. A GGUF
import, untrusted input converted in the same sandbox on the same worker, goes that way too."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from rl_engine import sandbox
from tests.hostile_programs import PROGRAMS, HostWorld
from tests.support.stack import PlatformStack, free_port, platform_stack, postgres_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.status().available, reason=f"no sandbox here: {sandbox.status().detail}"),
]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[PlatformStack]:
    from django.db import connection

    no_ray = f"http://127.0.0.1:{free_port()}"  # "Try it" needs no Ray; the programs aim at the real servers
    with platform_stack(no_ray, tmp_path_factory.mktemp("try-stack"), postgres_url(connection.settings_dict)) as s:
        yield s


@pytest.fixture(scope="module")
def world(stack, tmp_path_factory) -> Iterator[HostWorld]:
    with HostWorld(tmp_path_factory.mktemp("hostile-try")) as host:
        # The real web server is the target: its pid (for /proc, kill, ptrace) and its port.
        host.web_pid, host.web_port = stack.web.process.pid, stack.web.port
        yield host


@pytest.fixture
def session(stack) -> requests.Session:
    from rest_framework.authtoken.models import Token

    from tests.unit.platform.helpers import a_researcher

    session = requests.Session()
    session.headers["Authorization"] = f"Token {Token.objects.create(user=a_researcher()).key}"
    return session


def descendants(pid: int) -> set[int]:
    """Every process below `pid` on this host."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_a_hostile_try_it_is_contained_and_the_platform_stays_up(program, stack, world, session):
    base = stack.web.url
    created = session.post(
        f"{base}/api/rewards/",
        json={
            "name": f"hostile {program.name}",
            "kind": "python",
            "source": world.reward_file(program),
            "spec": {"timeout_s": program.timeout_s, "memory_mb": program.memory_mb},
        },
        timeout=120,
    )
    assert created.status_code == 201, created.text  # importing the file runs no attack
    web_children_before = descendants(stack.web.process.pid)
    response = session.post(
        f"{base}/api/rewards/{created.json()['id']}/try/",
        json={"samples": [{"prompt": "2+2=", "response": "4", "label": "4"}]},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    error = "; ".join(body["errors"][0]) or None
    assert program.contained(body["scores"][0], error), f"{program.name}: {body}"
    # The web server and the workers are still there and still answer; the web server started nothing.
    assert stack.web.process.poll() is None and stack.worker.poll() is None and stack.user_code_worker.poll() is None
    assert session.get(f"{base}/api/health/", timeout=30).status_code in (200, 503)
    assert descendants(stack.web.process.pid) <= web_children_before
    logs = [stack.web.log(), stack.worker_log.read_text()[-200_000:], stack.user_code_log.read_text()[-200_000:]]
    world.assert_untouched(program, [response.text, *logs])


def test_the_try_ran_on_the_worker_in_a_sandbox_not_under_the_web_server(stack, session, tmp_path):
    source = "import os\n\ndef reward_func(queries, prompts, labels, **kwargs):\n    return [float(os.getuid())]\n"
    reward = session.post(
        f"{stack.web.url}/api/rewards/", json={"name": "whoami", "kind": "python", "source": source}, timeout=120
    ).json()
    body = session.post(
        f"{stack.web.url}/api/rewards/{reward['id']}/try/",
        json={"samples": [{"prompt": "p", "response": "r"}]},
        timeout=120,
    ).json()
    assert body["scores"] == [float(sandbox.SANDBOX_UID)]  # the sandbox's user, whoever runs the platform
    # On the user-code worker, never the one that submits and admits runs.
    # Celery logs "Task workers.reward_trial_run[<id>] received" where it ran.
    assert "workers.reward_trial_run[" in stack.user_code_log.read_text()
    assert "workers.reward_trial_run[" not in stack.worker_log.read_text()


def test_a_builtin_try_is_scored_by_a_child_of_the_user_code_worker(stack, session):
    # The child the worker starts for a builtin (python -m rl_engine.rewards score --cap-s) imports this
    # checkout and answers; the catastrophic pattern finishes there in linear time.
    spec = {"type": "regex", "pattern": r"^(a+)+$"}
    reward = session.post(
        f"{stack.web.url}/api/rewards/", json={"name": "nested", "kind": "builtin", "spec": spec}, timeout=120
    ).json()
    body = session.post(
        f"{stack.web.url}/api/rewards/{reward['id']}/try/",
        json={"samples": [{"prompt": "p", "response": "a" * 31 + "!"}, {"prompt": "p", "response": "aaa"}]},
        timeout=120,
    ).json()
    assert (body["scores"], body["errors"]) == ([0.0, 1.0], [[], []]), body


def test_an_uploaded_gguf_is_converted_on_the_user_code_worker_and_becomes_a_model(stack, session, tmp_path):
    from tests.support.gguf_files import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2")
    with gguf.open("rb") as handle:  # through the web server's body bound and its upload handler
        answer = session.post(f"{stack.web.url}/api/models/import-gguf/", files={"file": handle}, timeout=120)
    assert answer.status_code == 202, answer.text
    record = answer.json()
    deadline = time.monotonic() + 300
    while record["state"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(1)
        record = session.get(f"{stack.web.url}{record['url']}", timeout=30).json()
    assert record["state"] == "done", record["error"]
    assert record["model"]["architecture"] == "Qwen2ForCausalLM" and record["model"]["source"] == "gguf"
    assert record["model"]["provenance"]["check"]["tokens"] == 8
    assert "workers.model_import_run[" in stack.user_code_log.read_text()
    assert "workers.model_import_run[" not in stack.worker_log.read_text()
