"""The executor the training loop calls each step: it hands the step's tasks out to agent sessions, generates
their completions in batches on the loop's thread, and turns each finished session into a trajectory."""

from __future__ import annotations

import hmac
import os
import queue
import secrets
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
from pathlib import Path
from typing import Any

from rl_engine.agent_endpoint.launcher import start_agent
from rl_engine.agent_endpoint.protocol import TOKEN_ENV, TOKEN_FILE, AgentError, Completion, _check_request
from rl_engine.agent_endpoint.server import _Handler, _TCPHTTPServer, _UnixHTTPServer
from rl_engine.config import AgentConfig, RunConfig
from rl_engine.data import Prompt
from rl_engine.executors import Rollouts, Trajectory
from rl_engine.rollout import FinishReason, Sample, SamplingParams
from rl_engine.user_output import MarkedOutput

TASK_WAIT_S = 30.0


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
