"""The executors other than one response per prompt: a multi-turn environment, or an external agent."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rl_engine.config.errors import FieldErrors
from rl_engine.config.schema.base import _Section


class EnvironmentConfig(_Section):
    """A multi-turn environment from a Python file (see rl_engine/environments): the model acts, the
    environment answers with an observation and a reward, until it says done or the turns run out."""

    package: Literal["textarena", "openenv", "verifiers"] | None = Field(
        default=None,
        description="An installed environment package, through the adapter the engine ships for it "
        "(rl_engine/environments/adapters); empty = your own file at path.",
    )
    path: str | None = Field(
        default=None, min_length=1, description="Python file defining the environment class (not with package)."
    )
    name: str = Field(default="Environment", min_length=1, description="Name of the class in the file.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the class (a package's: its game or server)."
    )
    files: list[str] = Field(
        default_factory=list,
        description="Files the environment imports (modules, data), shown read-only beside it in its sandbox.",
    )
    max_turns: int = Field(default=4, ge=1, le=64, description="Most model turns per episode.")
    max_observation_tokens: int = Field(
        default=64, ge=1, description="An observation longer than this is cut to its first tokens."
    )
    timeout_s: float = Field(default=5.0, gt=0, description="Time limit of each reset/step call.")
    memory_mb: float = Field(
        default=1024, gt=0, description="Memory cap of the environment's sandbox, in MB (processes and /tmp)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvironmentConfig:
        if self.package is None and self.path is None:
            raise FieldErrors([("path", "give the environment's file, or an installed package in package")])
        if self.package is not None and self.path is not None:
            raise FieldErrors([("path", f"leave it out with package {self.package!r}: the engine ships its adapter")])
        return self


class AgentConfig(_Section):
    """An external agent program as the executor, through an OpenAI-compatible endpoint the engine
    serves while the run trains (see rl_engine/agent_endpoint/)."""

    host: str = Field(default="127.0.0.1", min_length=1, description="Interface the endpoint listens on.")
    port: int = Field(default=0, ge=0, le=65535, description="Port of the endpoint (0 = any free port).")
    command: str | None = Field(
        default=None,
        description="Agent command the engine starts itself in the sandbox, with POSTTRAIN_AGENT_URL set (optional).",
    )
    files: list[str] = Field(
        default_factory=list,
        description="Files the command needs (its script, its data), shown read-only in its sandbox at the same paths.",
    )
    memory_mb: float = Field(
        default=4096, ge=64, description="Memory cap of the agent's sandbox, in MB (all its processes and /tmp)."
    )
    max_turns: int = Field(default=8, ge=1, le=256, description="Most chat completions per session.")
    step_timeout_s: float = Field(
        default=600.0, gt=0, description="Sessions still open this long after a step began end with reward 0."
    )
