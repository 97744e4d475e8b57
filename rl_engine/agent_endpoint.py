"""An external agent program as the executor: while a run trains, the engine serves an
OpenAI-compatible endpoint backed by the run's rollout engine, and every finished agent session
becomes one training trajectory with the reward the agent reports.

The protocol (all JSON; `http://HOST:PORT` is logged at the start of the run; `agent.command` runs in
the sandbox of rl_engine/sandbox.py, without network, and gets POSTTRAIN_AGENT_URL=http://127.0.0.1:PORT,
which socat serves there from a Unix socket the endpoint also listens on). Every request carries the run's
own secret, `Authorization: Bearer <token>` (OpenAI clients send their api_key so): the command gets it as
POSTTRAIN_AGENT_TOKEN and OPENAI_API_KEY; an agent the engine does not start reads it from the run folder's
`agent_token` file (0600), or sets it for the engine in POSTTRAIN_AGENT_TOKEN. Anything else on the
machine, another run's reward or agent included, gets a 401 and no task.

    POST /sessions                          -> {"session_id", "base_url", "model", "prompt", "label", "metadata"}
        Takes the next task of the current step (a dataset row; each row is handed out
        `rollout.samples_per_prompt` times, a GRPO group). Waits up to 30 s for the next step;
        503 when none came, 410 once the run is over.
    POST {base_url}/chat/completions        (base_url = /sessions/<id>/v1: any OpenAI client works)
        {"model", "messages": [...], "max_tokens": n} -> a `chat.completion`; with `"stream": true`
        the same reply as Server-Sent Events, `chat.completion.chunk`s (one per token, then the
        finish_reason, then usage when `stream_options.include_usage`) ending in `data: [DONE]`.
        The first call's messages are the session's prompt; each later call must repeat the
        conversation so far (including the replies it got) and add messages after it. What the
        engine does not do is refused with a 400 whose `error.param` names the field: `n` > 1,
        `tools`/`functions`, a `response_format` other than text, a `model` other than the run's.
    GET  {base_url}/models, GET /v1/models
    POST /sessions/<id>/finish              {"reward": number} -> {"ok": true}

Token in / token out: the session keeps the engine's own token ids for every reply; only the
messages the agent adds are tokenised (rendered with the model's chat template when the run's data
uses one, else their contents concatenated) and enter the trajectory as observations, masked out of
the loss. Sampling follows the run's `rollout` settings (temperature, top-p, top-k; `max_tokens` is
capped by `rollout.max_new_tokens`) so that trajectories are on-policy; the request's own sampling
fields are ignored. Streaming changes only how the reply travels: the trajectory holds the same token
ids and log-probs either way. Requests of concurrent sessions are generated together in one batch, on the
training loop's thread, while the loop waits for the step's sessions to finish.
"""

from __future__ import annotations

import hmac
import json
import os
import queue
import re
import secrets
import shlex
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rl_engine.config import AgentConfig, RunConfig
from rl_engine.data import Prompt
from rl_engine.executors import Rollouts, Trajectory
from rl_engine.rollout import FinishReason, Sample, SamplingParams
from rl_engine.sandbox import Limits, Sandbox, SandboxProcess, SandboxUnavailable, python_runtime
from rl_engine.user_output import MarkedOutput

TASK_WAIT_S = 30.0
# Connections waiting to be accepted: an agent opens many at once (socketserver's default of 5 is for a toy
# server; past it connections wait or are refused while the endpoint is busy generating).
ENDPOINT_BACKLOG = 128
TOKEN_ENV = "POSTTRAIN_AGENT_TOKEN"
TOKEN_FILE = "agent_token"
_SESSION_PATH = re.compile(r"^/sessions/([0-9a-f]{32})(/.*)$")


class AgentError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param  # the request field at fault, as OpenAI's errors name it


@dataclass(frozen=True)
class Completion:
    """A reply as `chat.completion`, and the engine's token ids of its text (what a stream sends)."""

    reply: dict[str, Any]
    token_ids: list[int]


@dataclass
class _Session:
    id: str
    slot: int
    prompt: Prompt
    messages: list[dict[str, Any]] = field(default_factory=list)
    trajectory: Trajectory = field(default_factory=Trajectory)
    turns: list[dict[str, Any]] = field(default_factory=list)
    completions: int = 0
    finish_reason: FinishReason = "stop"
    last_text: str = ""
    reward: float | None = None
    error: str | None = None
    closed: bool = False  # finished by the agent, or expired with its step


@dataclass
class _Generation:
    session: _Session
    context: list[int]
    max_tokens: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Sample | None = None
    text: str = ""
    error: str | None = None


class AgentExecutor:
    """The executor the loop calls each step; the HTTP server runs in threads of its own, and only
    hands generation requests over to `run`, which owns the rollout engine."""

    def __init__(self, rollout: Any, tokenizer: Any, cfg: RunConfig):
        self.rollout, self.tokenizer, self.cfg = rollout, tokenizer, cfg
        assert cfg.agent is not None  # build_executor makes an agent executor only for a config with an agent
        self.agent: AgentConfig = cfg.agent
        self.model_name = cfg.name
        self._lock = threading.Condition()
        self._tasks: deque[tuple[int, Prompt]] = deque()
        self._sessions: dict[str, _Session] = {}
        self._requests: queue.Queue[_Generation] = queue.Queue()
        self._over = False
        # The run's own secret: every request must carry it (a session is a task of this run's training).
        self.token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
        self.token_file: Path | None = None
        executor = self

        class Handler(_Handler):
            owner = executor

        self.server = _TCPHTTPServer((self.agent.host, self.agent.port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{self.agent.host}:{self.port}"
        self._servers: list[socketserver.BaseServer] = [self.server]
        self.process: subprocess.Popen | None = None
        self._output: MarkedOutput | None = None
        self._socket_dir: str | None = None
        if self.agent.command:
            # The agent runs in a sandbox without network: the endpoint also listens on a Unix socket that
            # the sandbox sees, and socat serves it there on 127.0.0.1:<port>.
            self._socket_dir = tempfile.mkdtemp(prefix="posttrain-agent-")
            socket_path = os.path.join(self._socket_dir, "endpoint.sock")
            unix_server = _UnixHTTPServer(socket_path, Handler)
            os.chmod(socket_path, 0o666)  # the sandbox's user connects (nobody, when the engine is root)
            self._servers.append(unix_server)
        for server in self._servers:
            threading.Thread(target=server.serve_forever, name="agent-endpoint", daemon=True).start()
        if self.agent.command:
            try:
                self.process = start_agent(self.agent, self.agent.command, self.port, socket_path, self.url, self.token)
            except BaseException:
                self.close()
                raise
            self._output = MarkedOutput(self.process.stdout, label="agent")
        elif not os.environ.get(TOKEN_ENV):
            self._hand_out_token(cfg.logging.run_dir)

    def _hand_out_token(self, run_dir: str | None) -> None:
        """An agent the engine does not start needs the secret: in the run folder (0600), never in the log,
        which the run's viewers read; a run started by hand without a folder prints it to its own terminal."""
        if run_dir:
            self.token_file = Path(run_dir) / TOKEN_FILE
            self.token_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(self.token)
        elif not os.environ.get("POSTTRAIN_RUN_ID"):
            print(f"agent endpoint token ({TOKEN_ENV}): {self.token}", file=sys.stderr)

    def authorized(self, header: str | None) -> bool:
        expected = f"Bearer {self.token}".encode()
        return hmac.compare_digest((header or "").encode(), expected)

    def describe(self) -> str:
        text = f"agent endpoint {self.url}"
        if self.agent.command:
            return text + f" (agent: {self.agent.command})"
        if self.token_file is not None:
            text += f" (its token is in {self.token_file})"
        return text

    # --- the loop's side -------------------------------------------------------------------------

    def run(self, prompts: list[Prompt], params: SamplingParams) -> Rollouts:
        sessions_before = set(self._sessions)
        slots = len(prompts) * params.n
        with self._lock:
            self._tasks.extend((slot, prompts[slot // params.n]) for slot in range(slots))
            self._lock.notify_all()
        deadline = time.monotonic() + self.agent.step_timeout_s
        one = replace(params, n=1)
        while True:
            with self._lock:
                mine = [s for k, s in self._sessions.items() if k not in sessions_before]
                if len(mine) == slots and all(s.closed for s in mine):
                    break
            if self._over:
                self._expire(mine, "the run stopped")
                break
            if time.monotonic() > deadline:
                self._expire(
                    mine,
                    f"the agent did not finish the session within agent.step_timeout_s "
                    f"({self.agent.step_timeout_s:g}s)",
                )
                break
            self._serve_generations(one)
        with self._lock:
            self._tasks.clear()  # rows no session took: the step goes on without them
            mine = sorted((s for k, s in self._sessions.items() if k not in sessions_before), key=lambda s: s.slot)
            for session in mine:
                del self._sessions[session.id]
        return self._rollouts(mine, prompts, params.n)

    def _serve_generations(self, params: SamplingParams) -> None:
        """Generates every request waiting now (at most 50 ms after the first) in batches by max_tokens."""
        try:
            batch = [self._requests.get(timeout=0.05)]
        except queue.Empty:
            return
        while True:
            try:
                batch.append(self._requests.get_nowait())
            except queue.Empty:
                break
        for max_tokens in sorted({r.max_tokens for r in batch}):
            group = [r for r in batch if r.max_tokens == max_tokens]
            try:
                samples = self.rollout.generate([r.context for r in group], replace(params, max_new_tokens=max_tokens))
                texts = self.tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
            except Exception as exc:
                for request in group:
                    request.error = f"{type(exc).__name__}: {exc}"
                    request.done.set()
                raise
            for request, sample, text in zip(group, samples, texts):
                request.result, request.text = sample, text
                request.done.set()

    def _expire(self, sessions: list[_Session], reason: str) -> None:
        with self._lock:
            for session in sessions:
                if not session.closed:
                    session.closed, session.error = True, reason

    def _rollouts(self, sessions: list[_Session], prompts: list[Prompt], n: int) -> Rollouts:
        by_slot = {s.slot: s for s in sessions}
        missing = [slot for slot in range(len(prompts) * n) if slot not in by_slot]
        for slot in missing:  # no agent took the task in time: an empty trajectory with reward 0
            by_slot[slot] = _Session("", slot, prompts[slot // n], error="no agent session took this task in time")
        ordered = [by_slot[slot] for slot in range(len(prompts) * n)]
        return Rollouts(
            samples=[s.trajectory.sample(slot // n, s.finish_reason) for slot, s in enumerate(ordered)],
            env_rewards=[s.reward if s.reward is not None and s.error is None else 0.0 for s in ordered],
            errors=[[f"agent: {s.error}"] if s.error else [] for s in ordered],
            turns=[s.turns for s in ordered],
            logs=[
                {"turns": float(s.completions), "finished": float(s.reward is not None and s.error is None)}
                for s in ordered
            ],
            final_texts=[s.last_text for s in ordered],
        )

    def close(self) -> None:
        with self._lock:
            self._over = True
            self._lock.notify_all()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        if self.token_file is not None:
            self.token_file.unlink(missing_ok=True)

    # --- the server's side (handler threads) -----------------------------------------------------

    def open_session(self) -> dict[str, Any]:
        deadline = time.monotonic() + TASK_WAIT_S
        with self._lock:
            while not self._tasks:
                if self._over:
                    raise AgentError(410, "the run is over")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentError(503, "no task right now (the run is between steps); try again")
                self._lock.wait(left)
            slot, prompt = self._tasks.popleft()
            session = _Session(uuid.uuid4().hex, slot, prompt)
            self._sessions[session.id] = session
        return {
            "session_id": session.id,
            "base_url": f"{self.url}/sessions/{session.id}/v1",
            "model": self.model_name,
            "prompt": prompt.raw,
            "label": prompt.label,
            "metadata": prompt.metadata,
        }

    def session(self, session_id: str) -> _Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise AgentError(404, f"no open session {session_id}")
        if session.closed:
            raise AgentError(410, f"session {session_id} is closed ({session.error or 'finished'})")
        return session

    def finish(self, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        reward = body.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise AgentError(400, f"reward: a number is required, got {reward!r}")
        session = self.session(session_id)
        if not session.completions:
            raise AgentError(400, "the session has no completion to train on; call chat/completions first")
        with self._lock:
            session.reward, session.closed = float(reward), True
        return {"ok": True}

    def complete(self, session_id: str, body: dict[str, Any]) -> Completion:
        session = self.session(session_id)
        _check_request(body, self.model_name)
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise AgentError(
                400, "messages: a non-empty list of {role, content} with string contents is required", "messages"
            )
        if session.completions >= self.agent.max_turns:
            raise AgentError(400, f"the session used its agent.max_turns ({self.agent.max_turns}) completions")
        max_tokens = next(
            (body[k] for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None),
            self.cfg.rollout.max_new_tokens,
        )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise AgentError(400, f"max_tokens: a positive integer is required, got {max_tokens!r}", "max_tokens")
        added = self._extend(session, messages)
        request = _Generation(
            session,
            session.prompt.token_ids + session.trajectory.tokens,
            min(max_tokens, self.cfg.rollout.max_new_tokens),
        )
        self._requests.put(request)
        while not request.done.wait(1.0):
            with self._lock:
                if self._over or session.closed:
                    raise AgentError(410, f"session {session_id} closed while generating")
        if request.error is not None:
            raise AgentError(500, f"generation failed: {request.error}")
        sample = request.result
        assert sample is not None  # a request is done with its result or with its error (_serve_generations)
        with self._lock:
            for text in added:
                session.turns.append({"role": "environment", "text": text, "reward": None})
            session.trajectory.act(sample)
            session.messages = [*messages, {"role": "assistant", "content": request.text}]
            session.turns.append({"role": "assistant", "text": request.text, "reward": None})
            session.completions += 1
            session.finish_reason, session.last_text = sample.finish_reason, request.text
        reply = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": request.text},
                    "finish_reason": sample.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": len(request.context),
                "completion_tokens": len(sample.response_ids),
                "total_tokens": len(request.context) + len(sample.response_ids),
            },
        }
        return Completion(reply, list(sample.response_ids))

    def _extend(self, session: _Session, messages: list[dict[str, Any]]) -> list[str]:
        """Checks `messages` continue the session; appends the new messages' tokens (observations) to
        it and returns their texts. The first call's messages must be the task's prompt."""
        data = self.cfg.data
        if not session.completions:
            if self._render(messages, first=True) != session.prompt.text:
                raise AgentError(
                    400,
                    "messages: the first request must be the session's prompt (as one user "
                    "message, with the run's system prompt if it has one)",
                )
            return []
        known = len(session.messages)
        if [(m["role"], m["content"]) for m in messages[:known]] != [
            (m["role"], m["content"]) for m in session.messages
        ]:
            raise AgentError(
                400,
                "messages: must repeat the session's conversation so far, the replies it got "
                "included, and add new messages after it",
            )
        new = messages[known:]
        if not new:
            return []
        if data.apply_chat_template:
            before = self.tokenizer.apply_chat_template(session.messages, tokenize=False)
            after = self._render(messages, first=False)
            text = after[len(before) :] if after.startswith(before) else self._render(new, first=False)
        else:
            text = "".join(m["content"] for m in new)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        with self._lock:
            session.trajectory.observe(ids)
        return [m["content"] for m in new]

    def _render(self, messages: list[dict[str, Any]], first: bool) -> str:
        if not self.cfg.data.apply_chat_template:
            return "".join(m["content"] for m in messages)
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        return self.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


# Inside the agent's sandbox: socat serves the endpoint's Unix socket on 127.0.0.1:<port> (and every other
# address of the sandbox's own network, where nothing else lives); the agent starts once it listens.
_AGENT_LAUNCHER = """
port=$1; socket=$2; shift 2
socat -lf /dev/null TCP-LISTEN:"$port",reuseaddr,fork UNIX-CONNECT:"$socket" &
listening=$(printf '00000000:%04X 00000000:0000 0A' "$port")
tries=0
until grep -q "$listening" /proc/net/tcp; do
    tries=$((tries + 1))
    if [ "$tries" -gt 500 ]; then echo "agent sandbox: socat did not start" >&2; exit 70; fi
    sleep 0.01
done
exec /bin/sh -c "$1"
"""


def start_agent(agent: AgentConfig, command: str, port: int, socket_path: str, url: str, token: str) -> SandboxProcess:
    """`command` (the config's `agent.command`) in the sandbox (rl_engine/sandbox.py): the endpoint at
    POSTTRAIN_AGENT_URL with its secret in POSTTRAIN_AGENT_TOKEN (and OPENAI_API_KEY, which OpenAI clients
    send), the files of `agent.files` read-only at their own paths, the engine's working folder as its own
    (read-only: it writes in /tmp). Without a sandbox (allowed by the admin) it runs as a plain child with the same
    cleared environment, on the endpoint's TCP port."""
    secret = {TOKEN_ENV: token, "OPENAI_API_KEY": token}
    box = Sandbox.create(Limits(memory_mb=agent.memory_mb))
    cwd = os.getcwd()
    for name in agent.files:
        path = Path(cwd, name)
        if not path.is_file():
            raise ValueError(f"agent.files: {name} is not a file")
        box.add_file(path, same_path=True)
    _refuse_unlisted_files(agent, cwd)
    if not box.sandboxed:
        return box.popen(["/bin/sh", "-c", command], env={"POSTTRAIN_AGENT_URL": url, **secret})
    if shutil.which("socat", path="/usr/bin:/bin") is None:
        raise SandboxUnavailable("agent.command: socat is missing (apt-get install socat; `make install` does it)")
    box.cwd = cwd
    inside = box.add_socket(socket_path, "agent.sock")
    launcher = ["/bin/sh", "-c", _AGENT_LAUNCHER, "agent", str(port), inside, command]
    return box.popen(launcher, env={"POSTTRAIN_AGENT_URL": f"http://127.0.0.1:{port}", **secret})


def _refuse_unlisted_files(agent: AgentConfig, cwd: str) -> None:
    """A file the command names that its sandbox would not show: say so at start, not as a failed agent."""
    listed = {Path(cwd, name).resolve() for name in agent.files}
    runtime = [real for real, _ in python_runtime()] + ["/usr", "/bin", "/lib"]
    try:
        words = shlex.split(agent.command or "")
    except ValueError as exc:
        raise ValueError(f"agent.command: {exc}") from None
    for word in words:
        path = Path(cwd, word)
        shown = any(str(path.resolve()).startswith(folder.rstrip("/") + "/") for folder in runtime)
        if "/" in word and path.is_file() and path.resolve() not in listed and not shown:
            raise ValueError(
                f"agent.files: the command names {word}, which its sandbox does not show; list it in agent.files"
            )


class _EndpointServer:
    """What both of the endpoint's servers share: request threads that never hold the engine's exit, and a
    backlog sized for an agent's many connections."""

    daemon_threads = True
    request_queue_size = ENDPOINT_BACKLOG


class _UnixHTTPServer(_EndpointServer, socketserver.ThreadingUnixStreamServer):
    pass


class _TCPHTTPServer(_EndpointServer, ThreadingHTTPServer):
    pass


def _check_request(body: dict[str, Any], model_name: str) -> None:
    """Refuses, naming the field, what the endpoint cannot honour; silently ignoring it would hand an
    agent framework something other than what it asked for."""
    model = body.get("model")
    if model is not None and model != model_name:
        raise AgentError(
            400, f"model: this endpoint serves only {model_name!r} (the run's policy), got {model!r}", "model"
        )
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n != 1):
        raise AgentError(
            400, f"n: one completion per request (the run samples its groups through sessions), got {n!r}", "n"
        )
    for field_name in ("tools", "functions"):
        if body.get(field_name):
            raise AgentError(
                400,
                f"{field_name}: tool calling is not supported; describe the tools in the messages and parse the "
                "reply's text (its tokens are what the policy is trained on)",
                field_name,
            )
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise AgentError(400, 'response_format: only {"type": "text"} (no constrained decoding)', "response_format")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise AgentError(400, f"stream: must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise AgentError(400, 'stream_options: must be an object such as {"include_usage": true}', "stream_options")


def stream_chunks(completion: Completion, tokenizer: Any, include_usage: bool) -> list[dict[str, Any]]:
    """The reply as `chat.completion.chunk`s: the role, one content delta per token (decoded
    incrementally, so the deltas concatenate to exactly the reply's text), the finish_reason, usage."""
    reply = completion.reply
    choice = reply["choices"][0]
    text = choice["message"]["content"]
    base = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"], "model": reply["model"]}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    sent = ""
    for end in range(1, len(completion.token_ids) + 1):
        decoded = tokenizer.decode(completion.token_ids[:end], skip_special_tokens=True)
        # A token that ends inside a multi-byte character decodes to U+FFFD until the next one completes it.
        if decoded.endswith("\ufffd") or not decoded.startswith(sent) or not text.startswith(decoded):
            continue
        if len(decoded) > len(sent):
            chunks.append(chunk({"content": decoded[len(sent) :]}))
            sent = decoded
    if sent != text:  # whatever incremental decoding could not attribute to a token
        chunks.append(chunk({"content": text[len(sent) :]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": reply["usage"]})
    return chunks


class _Handler(BaseHTTPRequestHandler):
    owner: AgentExecutor
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the run's events say what happened; per-request lines would flood the job log

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, chunks: list[dict[str, Any]]) -> None:
        """Server-Sent Events in HTTP/1.1 chunked transfer encoding (the connection stays reusable)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in [*(f"data: {json.dumps(c)}\n\n" for c in chunks), "data: [DONE]\n\n"]:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            raise AgentError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise AgentError(400, "the body must be a JSON object")
        return body

    def _handle(self, method: str) -> None:
        try:
            owner = self.owner
            if not owner.authorized(self.headers.get("Authorization")):
                # Before anything else, the body included: no task, no session, no model name for a stranger.
                self.close_connection = True
                raise AgentError(401, f"a bearer token is required: the run's own ({TOKEN_ENV})")
            path = self.path.split("?", 1)[0]
            matched = _SESSION_PATH.match(path)
            session_id, rest = (matched.group(1), matched.group(2)) if matched else (None, path)
            if method == "GET" and rest == "/v1/models":
                reply = {
                    "object": "list",
                    "data": [{"id": owner.model_name, "object": "model", "owned_by": "posttrain"}],
                }
            elif method == "POST" and path == "/sessions":
                reply = owner.open_session()
            elif method == "POST" and session_id and rest == "/v1/chat/completions":
                body = self._body()
                completion = owner.complete(session_id, body)
                if body.get("stream"):
                    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    self._stream(stream_chunks(completion, owner.tokenizer, include_usage))
                    return
                reply = completion.reply
            elif method == "POST" and session_id and rest == "/finish":
                reply = owner.finish(session_id, self._body())
            else:
                raise AgentError(404, f"no route {method} {path}")
            self._reply(200, reply)
        except AgentError as exc:
            self._reply(
                exc.status,
                {
                    "error": {
                        "message": str(exc),
                        "type": "invalid_request_error" if exc.status in (400, 401) else "posttrain_error",
                        "param": exc.param,
                        "code": "invalid_api_key" if exc.status == 401 else None,
                    }
                },
            )

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")
