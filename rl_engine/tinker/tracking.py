"""Tinker sessions as Posttrain runs: the SDK's key is a Posttrain API token, each training client a run.

With ``--posttrain URL`` the service accepts any key ``tml-<token>`` whose token Posttrain accepts (checked
with ``/api/auth/me/``, the answer kept for a minute), and records each training client as an external run
of that token's user, in the project the session names (``project_id``) or the user's default, through the
Posttrain SDK's tracking (:func:`posttrain_sdk.tracking.init`): the run page shows its curves (the loss and
tokens of every ``forward_backward``, the learning rate and gradient norm of every ``optim_step``, the
seconds of each call kind), the sequences it sampled as rollouts, its full saves as checkpoints and its
saves for sampling in its log. A run cancelled in
Posttrain ends its training client: every later call fails with that reason in the client. A session
without a heartbeat for ``idle_s`` ends its runs (succeeded) and frees its models.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from posttrain_sdk import tracking
from posttrain_sdk.client import Client
from posttrain_sdk.errors import AuthError, PosttrainError
from rl_engine.tinker.losses import LossRefused
from rl_engine.tinker.service import CallRecord

__all__ = ["PosttrainRuns", "token_of"]

KEY_PREFIX = "tml-"
AUTH_CACHE_S = 60.0
STATE_CACHE_S = 2.0


def token_of(key: str) -> str:
    """The Posttrain token inside a Tinker key (the SDK only sends keys that start with ``tml-``)."""
    if not key.startswith(KEY_PREFIX) or len(key) <= len(KEY_PREFIX):
        raise LossRefused("X-API-Key: expected tml-<your Posttrain API token>")
    return key[len(KEY_PREFIX) :]


@dataclass
class _Tracked:
    run: tracking.TrackedRun
    token: str
    step: int = 0
    pending: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    state: str = "running"
    state_checked: float = 0.0


class PosttrainRuns:
    def __init__(self, url: str, run_root: Path, experiment: str = "tinker") -> None:
        self.url, self.run_root, self.experiment = url, run_root, experiment
        self._lock = threading.Lock()
        self._known: dict[str, tuple[str, float]] = {}  # token -> (username, checked at)
        self._runs: dict[str, _Tracked] = {}

    def authenticate(self, key: str) -> str:
        """The user a key belongs to; raises for a key Posttrain does not accept."""
        token = token_of(key)
        with self._lock:
            known = self._known.get(token)
        if known is not None and time.monotonic() - known[1] < AUTH_CACHE_S:
            return known[0]
        try:
            with Client(self.url, token) as client:
                username = str(client.me()["username"])
        except AuthError as exc:
            raise PermissionError("X-API-Key: Posttrain does not accept this token") from exc
        with self._lock:
            self._known[token] = (username, time.monotonic())
        return username

    def open(self, model_id: str, key: str, base_model: str, rank: int, project: str | None) -> str:
        """A run for a new training client; its page's URL."""
        run = tracking.init(
            self.experiment,
            name=f"tinker {base_model} {model_id[:8]}",
            config={"base_model": base_model, "lora_rank": rank, "tinker_model_id": model_id},
            project=project,
            engine="tinker",
            tags=["tinker"],
            dir=self.run_root,
            url=self.url,
            token=token_of(key),
        )
        with self._lock:
            self._runs[model_id] = _Tracked(run, token_of(key))
        return run.url

    def record(self, record: CallRecord) -> None:
        """A call's figures on its run: the forward/backward passes' since the last step, logged with the step."""
        with self._lock:
            tracked = self._runs.get(record.model_id)
        if tracked is None or tracked.run.finished:
            return
        if record.kind in ("forward_backward", "forward"):
            tracked.pending["loss/sum"] += record.metrics.get("loss:sum", 0.0)
            tracked.pending["train/tokens"] += record.metrics.get("tokens", 0.0)
            tracked.pending[f"time/{record.kind}_s"] += record.seconds
        elif record.kind == "optim_step":
            metrics = {**tracked.pending, "optim/lr": record.metrics["learning_rate"]}
            metrics |= {"optim/grad_norm": record.metrics["grad_norm"], "time/optim_step_s": record.seconds}
            tracked.run.log(metrics, step=tracked.step)
            tracked.pending.clear()
            tracked.step += 1
        elif record.kind == "sample":
            tracked.run.log({"time/sample_s": record.seconds}, step=tracked.step)
            tracked.run.log_samples(record.detail["rows"], step=tracked.step)
        elif record.kind == "weights":  # a full save (with Adam's state): the run's checkpoint at this step
            tracked.run.log_checkpoint(record.detail["path"], step=tracked.step)
        elif record.kind == "sampler_weights":  # several a step are common: a log line each, not a checkpoint
            tracked.run.log_text(f"weights saved for sampling: {record.detail['path']}", step=tracked.step)

    def check_open(self, model_id: str, key: str) -> None:
        """Refuses a call on another user's training client, or on one whose run was cancelled in Posttrain."""
        with self._lock:
            tracked = self._runs.get(model_id)
        if tracked is None:
            return
        if tracked.token != token_of(key):
            raise PermissionError(f"model_id {model_id!r} belongs to another key")
        if time.monotonic() - tracked.state_checked > STATE_CACHE_S and tracked.state == "running":
            tracked.state = self._state(tracked)
            tracked.state_checked = time.monotonic()
        if tracked.state == "cancelled":
            raise LossRefused(
                f"this training client's run {tracked.run.id} was cancelled in Posttrain ({tracked.run.url})"
            )

    def _state(self, tracked: _Tracked) -> str:
        try:
            with Client(self.url, tracked.token) as client:
                return str(client.get(f"/api/runs/{tracked.run.id}/")["state"])
        except PosttrainError:
            return tracked.state  # Posttrain unreachable: the session goes on; its events wait in the run folder

    def finish(self, model_id: str, reason: str, state: str = "succeeded") -> None:
        with self._lock:
            tracked = self._runs.pop(model_id, None)
        if tracked is not None and not tracked.run.finished:
            tracked.run.finish(state, reason, timeout_s=10.0)

    def run_url(self, model_id: str) -> str | None:
        with self._lock:
            tracked = self._runs.get(model_id)
        return None if tracked is None else tracked.run.url
