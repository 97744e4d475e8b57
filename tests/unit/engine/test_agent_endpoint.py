"""The OpenAI-compatible agent endpoint: a real HTTP server in front of the real tiny policy; sessions
become trajectories with the engine's token ids, the agent's messages masked as observations and the
agent's reward; bad requests are refused naming the field; the example agent drives a whole run."""

from __future__ import annotations

import json
import socket
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from posttrain_sdk.event_log import read_events
from rl_engine.config import validate_config
from rl_engine.demo.run_config import demo_run_config
from rl_engine.rollout import SamplingParams
from tests.unit.engine.helpers import rollouts_by_step

REPO = Path(__file__).resolve().parents[3]


def call(url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    """A request to the endpoint, with the run's token when given (every route requires it)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data, headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def config(demo: Path, **changes):
    base = dict(
        model={"path": str(demo / "model")},
        data={
            "path": str(demo / "data" / "train.jsonl"),
            "eval_path": str(demo / "data" / "test.jsonl"),
            "eval_size": 4,
        },
        rewards=[],
        rollout={"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
        train={"steps": 2, "micro_batch_size": 4},
        checkpoint={"every_steps": 0, "save_final": False},
        logging={"eval_every": 0},
        agent={"step_timeout_s": 60},
    )
    base.update(changes)
    return demo_run_config(demo, **base)


@pytest.fixture()
def endpoint(tiny_demo):
    """An executor over the real tiny policy, one step (2 prompts x 2) being served in a thread."""
    from rl_engine.agent_endpoint import AgentExecutor
    from rl_engine.components import load_policy, load_tokenizer
    from rl_engine.data import PromptData
    from rl_engine.rollout import TransformersRollout

    cfg = config(tiny_demo)
    tokenizer = load_tokenizer(cfg)
    rollout = TransformersRollout(load_policy(cfg.model.path, cfg), tokenizer)
    executor = AgentExecutor(rollout, tokenizer, cfg)
    prompts = PromptData.load(cfg.data, tokenizer, 0).train[:2]
    outcome: dict = {}
    step = threading.Thread(
        target=lambda: outcome.update(rollouts=executor.run(prompts, SamplingParams(n=2, max_new_tokens=4)))
    )
    step.start()
    yield executor, prompts, tokenizer, step, outcome
    executor.close()
    step.join(timeout=60)


def test_a_session_becomes_a_trajectory_with_the_agents_messages_masked(endpoint):
    executor, prompts, tokenizer, step, outcome = endpoint
    status, models = call(f"{executor.url}/v1/models", token=executor.token)
    assert status == 200 and models["data"][0]["id"] == executor.model_name
    sessions = [call(f"{executor.url}/sessions", {}, token=executor.token)[1] for _ in range(4)]
    assert [s["prompt"] for s in sessions] == [prompts[0].raw, prompts[0].raw, prompts[1].raw, prompts[1].raw]
    first = sessions[0]
    status, reply = call(
        f"{first['base_url']}/chat/completions",
        {"model": first["model"], "messages": [{"role": "user", "content": first["prompt"]}], "max_tokens": 3},
        token=executor.token,
    )
    assert status == 200 and reply["object"] == "chat.completion"
    said = reply["choices"][0]["message"]["content"]
    conversation = [
        {"role": "user", "content": first["prompt"]},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "=7"},
    ]
    status, again = call(f"{first['base_url']}/chat/completions", {"messages": conversation}, token=executor.token)
    assert status == 200
    for session, reward in zip(sessions, (1.0, 0.0, 0.5, 0.25)):
        if session is not first:
            call(
                f"{session['base_url']}/chat/completions",
                {"messages": [{"role": "user", "content": session["prompt"]}]},
                token=executor.token,
            )
        assert call(
            f"{executor.url}/sessions/{session['session_id']}/finish", {"reward": reward}, token=executor.token
        ) == (
            200,
            {"ok": True},
        )
    step.join(timeout=60)
    rollouts = outcome["rollouts"]
    assert rollouts.env_rewards == [1.0, 0.0, 0.5, 0.25]
    sample = rollouts.samples[0]
    observation = tokenizer("=7", add_special_tokens=False)["input_ids"]
    first_turn = reply["usage"]["completion_tokens"]
    # [first reply: the engine's ids] [the agent's "=7": tokenised, masked] [second reply]
    assert sample.response_ids[first_turn : first_turn + len(observation)] == observation
    assert sample.action_mask == (
        (1,) * first_turn + (0,) * len(observation) + (1,) * again["usage"]["completion_tokens"]
    )
    assert tokenizer.decode(sample.response_ids[:first_turn], skip_special_tokens=True) == said
    assert [t["role"] for t in rollouts.turns[0]] == ["assistant", "environment", "assistant"]
    assert rollouts.logs[0] == {"turns": 2.0, "finished": 1.0}


def test_bad_requests_are_refused_naming_what_is_wrong(endpoint):
    executor, prompts, tokenizer, step, outcome = endpoint
    session = call(f"{executor.url}/sessions", {}, token=executor.token)[1]
    url = f"{session['base_url']}/chat/completions"

    def ask(url: str, body: dict) -> tuple[int, dict]:  # this run's agent, with its token
        return call(url, body, token=executor.token)

    status, error = ask(url, {"messages": [{"role": "user", "content": "something else"}]})
    assert status == 400 and "first request must be the session's prompt" in error["error"]["message"]
    status, error = ask(url, {"messages": "hello"})
    assert status == 400 and error["error"]["message"].startswith("messages:")
    status, error = ask(url, {"messages": [{"role": "user", "content": session["prompt"]}], "max_tokens": 0})
    assert status == 400 and error["error"]["message"].startswith("max_tokens:")
    finish = f"{executor.url}/sessions/{session['session_id']}/finish"
    assert ask(finish, {"reward": 1.0})[0] == 400  # nothing generated yet: nothing to train on
    ask(url, {"messages": [{"role": "user", "content": session["prompt"]}]})
    status, error = ask(
        url, {"messages": [{"role": "user", "content": "rewritten history"}, {"role": "user", "content": "x"}]}
    )
    assert status == 400 and "repeat the session's conversation" in error["error"]["message"]
    status, error = ask(finish, {"reward": "high"})
    assert status == 400 and error["error"]["message"].startswith("reward:")
    assert call(f"{executor.url}/sessions/{'0' * 32}/finish", {"reward": 1}, token=executor.token)[0] == 404
    assert call(f"{executor.url}/nowhere", {}, token=executor.token)[0] == 404


def _openai_sessions(executor) -> list[dict]:
    return [call(f"{executor.url}/sessions", {}, token=executor.token)[1] for _ in range(4)]


def test_the_openai_client_sync_and_async_streamed_and_not_gets_the_recorded_tokens(endpoint):
    """Four sessions of one step, one per way agent frameworks call: sync and async clients, each with
    and without stream=True. Every reply's text is the decoding of exactly the token ids the trajectory
    records, with their log-probs, and the stream ends (the reader sees [DONE])."""
    import asyncio

    from openai import AsyncOpenAI, OpenAI

    executor, prompts, tokenizer, step, outcome = endpoint
    sessions = _openai_sessions(executor)
    texts: list[str] = []
    usage: list[int] = []

    def ask_sync(session: dict, stream: bool) -> None:
        client = OpenAI(base_url=session["base_url"], api_key=executor.token, max_retries=0, timeout=60)
        messages = [{"role": "user", "content": session["prompt"]}]
        if stream:
            chunks = list(
                client.chat.completions.create(
                    model=session["model"],
                    messages=messages,
                    max_tokens=4,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
            usage.append(chunks[-1].usage.completion_tokens)
        else:
            reply = client.chat.completions.create(model=session["model"], messages=messages, max_tokens=4)
            texts.append(reply.choices[0].message.content)
            usage.append(reply.usage.completion_tokens)

    async def ask_async(session: dict, stream: bool) -> None:
        client = AsyncOpenAI(base_url=session["base_url"], api_key=executor.token, max_retries=0, timeout=60)
        messages = [{"role": "user", "content": session["prompt"]}]
        if stream:
            parts, finish = [], None
            async for chunk in await client.chat.completions.create(
                model=session["model"],
                messages=messages,
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            ):
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
                else:
                    usage.append(chunk.usage.completion_tokens)
            assert finish in ("stop", "length")
            texts.append("".join(parts))
        else:
            reply = await client.chat.completions.create(model=session["model"], messages=messages, max_tokens=4)
            texts.append(reply.choices[0].message.content)
            usage.append(reply.usage.completion_tokens)
        await client.close()

    ask_sync(sessions[0], stream=False)
    ask_sync(sessions[1], stream=True)
    asyncio.run(ask_async(sessions[2], stream=False))
    asyncio.run(ask_async(sessions[3], stream=True))
    for session in sessions:
        assert (
            call(f"{executor.url}/sessions/{session['session_id']}/finish", {"reward": 1.0}, token=executor.token)[0]
            == 200
        )
    step.join(timeout=60)
    samples = outcome["rollouts"].samples
    for sample, text, completion_tokens in zip(samples, texts, usage):
        assert tokenizer.decode(sample.response_ids, skip_special_tokens=True) == text
        assert len(sample.response_ids) == completion_tokens and sample.action_mask == (1,) * completion_tokens
        assert sample.logprobs is not None and len(sample.logprobs) == completion_tokens
        assert all(lp <= 0.0 for lp in sample.logprobs)


def test_the_stream_sends_one_delta_per_token_that_concatenate_to_the_reply(tiny_demo):
    from rl_engine.agent_endpoint import Completion, stream_chunks
    from rl_engine.components import load_tokenizer

    tokenizer = load_tokenizer(config(tiny_demo))
    ids = tokenizer("12+30=42", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    reply = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(ids), "total_tokens": 3 + len(ids)},
    }
    chunks = stream_chunks(Completion(reply, ids), tokenizer, include_usage=True)
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(d or "" for d in deltas) == text and len([d for d in deltas[1:] if d]) == len(ids)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"] == reply["usage"]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("tools", [{"type": "function", "function": {"name": "add", "parameters": {}}}]),
        ("model", "gpt-4o"),
        ("response_format", {"type": "json_object"}),
    ],
)
def test_what_the_engine_does_not_do_is_a_400_naming_the_field(endpoint, field, value):
    from openai import BadRequestError, OpenAI

    executor, prompts, tokenizer, step, outcome = endpoint
    session = call(f"{executor.url}/sessions", {}, token=executor.token)[1]
    client = OpenAI(base_url=session["base_url"], api_key=executor.token, max_retries=0, timeout=60)
    request = {"model": session["model"], "messages": [{"role": "user", "content": session["prompt"]}], field: value}
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(**request)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == field and refused.value.body["message"].startswith(f"{field}:")
    with pytest.raises(BadRequestError):
        client.chat.completions.create(**request, stream=True)  # refused before any byte of a stream


def test_the_example_agent_drives_a_run_end_to_end(tiny_demo, tmp_path):
    from rl_engine.loop import train

    script = REPO / "rl_engine" / "environments" / "arithmetic_agent.py"
    cfg = config(
        tiny_demo,
        agent={"command": f"{sys.executable} {script} --workers 4", "files": [str(script)], "step_timeout_s": 120},
        rewards=[{"type": "regex", "name": "digit", "pattern": r"\d", "weight": 0.5}],
    )
    train(cfg, tmp_path)
    events = read_events(tmp_path / "events.jsonl")
    assert "agent endpoint http://127.0.0.1:" in next(e["data"]["message"] for e in events if e["type"] == "log")
    metrics = [e["data"] for e in events if e["type"] == "metrics" and e["step"] > 0]
    assert len(metrics) == 2
    for m in metrics:
        assert m["env/finished"] == 1.0  # every session the step handed out came back with a reward
        assert {"reward/environment", "reward/digit", "env/turns"} <= set(m)
    samples = rollouts_by_step(tmp_path)[2]
    assert len(samples) == 4 and all(s["turns"] and s["turns"][0]["role"] == "assistant" for s in samples)
    assert [s["group"] for s in samples] == [0, 0, 1, 1]


def test_an_agent_run_cannot_also_have_an_environment():
    from rl_engine.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        validate_config(
            {
                "name": "x",
                "model": {"path": "m"},
                "data": {"path": "d.jsonl"},
                "agent": {},
                "environment": {"path": "env.py"},
            }
        )
    assert [e["loc"] for e in refused.value.errors] == ["agent"]


AGENT_PROBE = """
import json, os, socket, sys, urllib.request
found = {"uid": os.getuid(), "cwd": os.getcwd(), "root": sorted(os.listdir("/"))}
request = urllib.request.Request(
    os.environ["POSTTRAIN_AGENT_URL"] + "/v1/models",
    headers={"Authorization": "Bearer " + os.environ["POSTTRAIN_AGENT_TOKEN"]},
)
with urllib.request.urlopen(request, timeout=30) as response:
    found["models"] = json.load(response)["data"][0]["id"]
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2)
    found["host_port"] = "reached"
except OSError as exc:
    found["host_port"] = type(exc).__name__
found["secret_env"] = sorted(k for k in os.environ if "TOKEN" in k and k != "TOKENIZERS_PARALLELISM")
found["run_folder"] = os.path.exists(sys.argv[2])
try:
    open("written-here", "w")
    found["cwd_writable"] = True
except OSError:
    found["cwd_writable"] = False
print("PROBE " + json.dumps(found), flush=True)
"""


def test_the_agent_command_runs_sandboxed_and_reaches_only_the_endpoint(tiny_demo, tmp_path, monkeypatch, capfd):
    from rl_engine import sandbox
    from rl_engine.agent_endpoint import AgentExecutor

    if not sandbox.status().available:
        pytest.skip(sandbox.status().detail)
    probe = tmp_path / "probe.py"
    probe.write_text(AGENT_PROBE)
    run_folder = tmp_path / "runs" / "another"
    run_folder.mkdir(parents=True)
    monkeypatch.setenv("POSTTRAIN_INGEST_TOKEN", "a-secret-the-agent-must-not-see")
    monkeypatch.chdir(tmp_path)
    with socket_listening() as host_port:
        command = f"python probe.py {host_port} {run_folder}"
        executor = AgentExecutor(None, None, config(tiny_demo, agent={"command": command, "files": ["probe.py"]}))
        try:
            assert executor.process.wait(timeout=60) == 0
        finally:
            executor.close()
    # What the agent printed reaches the log marked as user code, line by line.
    line = next(line for line in capfd.readouterr().err.splitlines() if "PROBE " in line)
    assert line.startswith("[user code: agent] PROBE ")
    found = json.loads(line.removeprefix("[user code: agent] PROBE "))
    assert found["models"] == executor.model_name  # the endpoint, through socat and the Unix socket
    assert found["host_port"] == "ConnectionRefusedError"  # nothing else of this host's network
    assert found["uid"] == sandbox.SANDBOX_UID and found["cwd"] == str(tmp_path)
    # Of secrets, only its own endpoint's token (never the run's ingestion token or anything else of the host's).
    assert found["secret_env"] == ["POSTTRAIN_AGENT_TOKEN"]
    assert found["run_folder"] is False and found["cwd_writable"] is False
    assert "home" not in found["root"] and "var" not in found["root"]


def test_a_file_the_agent_command_names_must_be_listed(tiny_demo, tmp_path, monkeypatch):
    from rl_engine.agent_endpoint import AgentExecutor

    (tmp_path / "agent.py").write_text("print('hi')")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="agent.files: the command names ./agent.py"):
        AgentExecutor(None, None, config(tiny_demo, agent={"command": "python ./agent.py"}))


@contextmanager
def socket_listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_every_route_needs_the_runs_own_token_and_a_stranger_gets_no_task(endpoint):
    """Another run's reward or agent (anything on the machine that finds the port) is refused before the
    endpoint reads its request: no session, no task, no model name."""
    executor, prompts, tokenizer, step, outcome = endpoint
    for token in (None, "a-guess", executor.token + "x"):
        for route, body in (("/sessions", {}), ("/v1/models", None), (f"/sessions/{'0' * 32}/finish", {"reward": 1})):
            status, error = call(f"{executor.url}{route}", body, token=token)
            assert status == 401 and error["error"]["code"] == "invalid_api_key", (route, token)
    status, session = call(f"{executor.url}/sessions", {}, token=executor.token)
    assert status == 200 and session["prompt"] == prompts[0].raw  # the first task is still there for the run's agent


def test_an_agent_the_engine_does_not_start_finds_the_token_in_the_run_folder_only(tiny_demo, tmp_path):
    from rl_engine.agent_endpoint import AgentExecutor

    executor = AgentExecutor(None, None, config(tiny_demo, logging={"eval_every": 0, "run_dir": str(tmp_path)}))
    try:
        token_file = tmp_path / "agent_token"
        assert token_file.read_text() == executor.token and token_file.stat().st_mode & 0o777 == 0o600
        assert executor.token not in executor.describe() and str(token_file) in executor.describe()
    finally:
        executor.close()
    assert not token_file.exists()
