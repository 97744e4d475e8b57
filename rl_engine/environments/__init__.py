"""Multi-turn environments, written by users in a Python file like reward functions, and run in the
same sandbox (a long-lived child process in bubblewrap, `rl_engine/sandbox/`, with a memory cap and a
time limit per call; see `rl_engine/rewards/python_fn.py`). The file is copied in alone: files next to it
are not there. Every call (a batch of resets or steps) is read back under a deadline, and what a call forked
is killed when it returns (`rl_engine/rewards/sandbox_worker.py`).

The interface — one instance per episode, built with the config's `environment.options`:

    class Environment:
        def __init__(self, **options): ...

        def reset(self, prompt: str, label: str | None, metadata: dict) -> str | None:
            '''Starts an episode for a dataset row (its prompt field, label and other fields). Returns
            text shown to the model after the prompt before its first turn (instructions, a first
            observation), or None.'''

        def step(self, action: str) -> tuple[str | None, float, bool] | tuple[str | None, float, bool, dict]:
            '''The model's turn (its text) -> (observation, reward, done[, logs]). The observation is
            shown to the model before its next turn (None: nothing); reward is this turn's; logs are
            numbers logged as `env/<name>` (per-episode, averaged over the step's episodes).'''

        def close(self) -> None:
            '''Optional: the episode is over (done, failed, or cut at max_turns); let go of what it holds.'''

A dict `{"observation", "reward", "done", "logs"}` is accepted as step's return value as well, and reset may
return `{"observation": ...}`. Either dict may say `"next_turn_trained": False`: the model's next turn is played
for another seat (self-play): it stays in the context and is masked out of the loss, like an observation, and
the reward functions score the learner's last turn. The episode's reward is the environment's (the learner's). The
episode ends when `done` is True or after `environment.max_turns` model turns. Its reward is the sum
of its turns' rewards, logged as the `environment` reward component (plus any `rewards` configured,
which score the model's last turn). A failing or timed-out call ends that episode with reward 0 and
the reason in the sample's errors; the run goes on.

Examples: `calculator.py` (tool use on the demo's arithmetic) and `guess_number.py` (a guessing game).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_engine.config import EnvironmentConfig
from rl_engine.environments.installed import environment_source

EXAMPLES = Path(__file__).parent
START_TIMEOUT_S = 30.0
HARD_KILL_GRACE_S = 2.0


class EnvironmentLoadError(ValueError):
    """The environment file cannot be used; names `environment.path`."""


class EnvironmentPool:
    """The episodes of a run, all in one sandboxed child process, driven in batches: one round trip
    per batch of resets or steps."""

    def __init__(self, cfg: EnvironmentConfig):
        self.cfg = cfg
        self._worker: Any = None
        self.seconds = 0.0  # time spent in environment calls, reset by the caller
        self.lost = False  # the last call lost the process, and with it every open episode

    def _ensure_worker(self) -> Any:
        from rl_engine.rewards.sandbox_worker import SandboxWorker, WorkerLoadError

        if self._worker is None or not self._worker.alive:
            path, name = environment_source(self.cfg)
            config = {
                "kind": "environment",
                "path": str(Path(path).resolve()),
                "class": name,
                "files": [str(Path(f).resolve()) for f in self.cfg.files],
                "options": self.cfg.options,
                "timeout_s": self.cfg.timeout_s,
                "memory_mb": self.cfg.memory_mb,
            }
            try:
                self._worker = SandboxWorker(config, START_TIMEOUT_S)
            except WorkerLoadError as exc:
                where = f"environment.package: {self.cfg.package}" if self.cfg.package else f"environment.path: {path}"
                raise EnvironmentLoadError(f"{where}: {'; '.join(exc.problems)}") from None
        return self._worker

    def call(self, op: str, items: list[tuple[int, Any]]) -> dict[int, tuple[bool, Any]]:
        """`op` ("reset", "step", "end") for each (episode, payload): episode -> (ok, value or reason).
        If the process dies or hangs, the items without a reply fail, and so does every other open
        episode (they lived in that process): callers see `lost` set."""
        from rl_engine.rewards.sandbox_worker import WorkerDied, WorkerTimeout

        if not items:
            return {}
        started = time.perf_counter()
        worker = self._ensure_worker()
        replies: dict[int, tuple[bool, Any]] = {}
        self.lost = False
        try:
            # One deadline for the request and each item's reply (every item is one call of user code).
            deadline = time.monotonic() + self.cfg.timeout_s + HARD_KILL_GRACE_S
            worker.send({"op": op, "items": items}, deadline)
            while True:
                reply = worker.recv(deadline)
                deadline = time.monotonic() + self.cfg.timeout_s + HARD_KILL_GRACE_S
                if reply.get("op") == "done":
                    if not worker.finish_call():  # what the call forked would not die, or it sent too much
                        worker.kill()
                        self.lost = True
                    elif reply.get("restart"):
                        worker.close()
                    break
                if reply.get("op") != "sample" or not isinstance(reply.get("ok"), bool):
                    raise WorkerDied("unexpected reply from the environment process")
                ok = reply["ok"]
                replies[reply.get("index")] = (True, reply.get("value")) if ok else (False, reply.get("reason"))
        except (WorkerTimeout, WorkerDied) as exc:
            reason = (
                f"{op}() did not return within {self.cfg.timeout_s + HARD_KILL_GRACE_S:g}s"
                if isinstance(exc, WorkerTimeout)
                else f"the environment process died: {exc}"
            )
            worker.kill()
            self.lost = True
            for episode, _ in items:
                replies.setdefault(episode, (False, reason))
        finally:
            self.seconds += time.perf_counter() - started
        return replies

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
