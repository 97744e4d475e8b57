"""verifiers environments' tasks as prompt rows and their reward functions as the reward, over verifiers' public
API only (`verifiers.v1`: a taskset by id and arguments, its tasks' data, `Task.score` on a `Trace`).

This file runs in the sandbox (copied in alone, like a user's reward file, with the reward's `files` beside it):
standard library and verifiers. A taskset id is what verifiers itself resolves: a taskset bundled with verifiers,
an installed environment package, or a module of `files`.

Generation (`python verifiers_tasksets.py generate SPEC_JSON FD`), SPEC_JSON {"taskset", "args", "size", "seed"}:
one JSON line per task, at most `size` (a finite taskset shuffled with `seed` first):
    {"prompt": the task's system prompt and prompt, "label": null, "data_source": "verifiers/<taskset>",
     "extra_info": {"taskset", "args", "task": the task's data as verifiers serialises it}}

Scoring (verl's per-sample shape, what `rl_engine/rewards/python_fn.py` calls): the task is rebuilt from its data,
the response becomes the trace's one sampled assistant message, and `Task.score` runs every reward function and
metric of the task; the score is the trace's weighted reward, and each function's own score is returned beside it
(`reward/<component>/<function>` curves).

Episodes (`environment: {package: verifiers, options: {taskset, args, env, env_args, max_turns}}`, the class
`Verifiers`): a taskset whose environment is its own `vf.Env` (a `run(task, agents)` playing the user) or whose
tasks have toolsets is played as the run's multi-turn environment, and its rows say so (`extra_info.episode`).
The environment's `run()` is verifiers' own, unmodified; its one agent seat is the policy. verifiers would run a
harness program that asks a model server for each reply; here each model turn the seat asks for is the engine's
step (its text, token ids kept by the engine), so control runs the other way: `reset` runs `run()` until the seat
first asks for a reply, each `step` hands the reply back and runs it to the next ask, and the episode is done when
`run()` returns. Within one seat turn (verifiers' `Interaction.turn`, one harness segment) a reply with tool calls
gets the tools' results as the next observation and the model goes on; a reply without calls ends the segment.
- Tools: the tasks' toolsets (`Task.toolsets`) are built per episode and registered on an in-process MCP server
  (the `mcp` package verifiers serves them with, without its HTTP transport), named `<server>_<tool>` as
  verifiers' harnesses name them; the model sees their JSON schemas in its first observation and calls them as
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; each result comes back in `<tool_response>` tags.
- Scoring: when the seat's interaction closes, its task's `Task.score` runs on the trace (the prompt, every reply,
  tool call and result, every user turn), then the environment's `finalize` on the episode; the episode's reward is
  the trace's weighted reward (what `run()` recorded included), its rewards and metrics are the episode's logs.
- Turns: a seat gets at most `max_turns` replies (the agent config's own `max_turns` if lower); then its next turn
  comes back terminated, as verifiers' turn limit does, and `run()` finishes. Give it the environment section's
  `max_turns` (the registry does) so that scoring runs before the engine stops the episode.
- The environment is the configured taskset's (`taskset`, `args`); a row holding a task of another taskset is
  refused at reset.
- One seat only: an environment declaring several agents (a user simulator, a judge) needs a second model, which a
  run does not have; it is refused at reset with the seats it declares.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import sys
from typing import Any

# verifiers, and the MCP server it serves tools with, load with this file (under the sandbox's start-up deadline)
# rather than in an episode's first reset, which has the per-call time limit.
import verifiers.v1 as vf
from mcp.server.mcpserver import MCPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the reward's files, beside this one

_TASKSETS: dict[str, Any] = {}


def _taskset_config(taskset: str, args: dict) -> Any:
    from verifiers.v1.utils.loaders import taskset_config_type

    key = json.dumps([taskset, args], sort_keys=True)
    if key not in _TASKSETS:
        _TASKSETS[key] = taskset_config_type(taskset).model_validate({**args, "id": taskset})
    return _TASKSETS[key]


def _prompt(data: Any) -> str:
    system = getattr(data, "system_prompt", None)
    return f"{system}\n\n{data.prompt_text}" if system else data.prompt_text


def generate(spec: dict) -> list[dict]:
    from verifiers.v1.utils.loaders import load_taskset

    taskset, args, size, seed = spec["taskset"], dict(spec.get("args") or {}), int(spec["size"]), int(spec["seed"])
    config = _taskset_config(taskset, args)
    tasks = load_taskset(config)
    view = tasks.shuffle(seed).take(size) if tasks.bounded else tasks.take(size)
    episode = _needs_episode(taskset, config)
    return [
        {
            "prompt": _prompt(task.data),
            "label": None,
            "data_source": f"verifiers/{taskset}",
            "extra_info": {
                "taskset": taskset,
                "args": args,
                "task": task.data.model_dump(mode="json"),
                **({"episode": True} if episode else {}),
            },
        }
        for task in view
    ]


def _needs_episode(taskset: str, config: Any) -> bool:
    """Whether the taskset is played as episodes: its own `Env`, or tools for the model."""
    from verifiers.v1.envs.single_agent import SingleAgentEnv
    from verifiers.v1.utils.loaders import environment_class, task_type

    return environment_class(taskset) is not SingleAgentEnv or bool(task_type(taskset).toolsets(config.task))


def _task(extra_info: Any) -> Any:
    """A generated row's task, rebuilt from its data."""
    from verifiers.v1.utils.loaders import task_type

    if not isinstance(extra_info, dict) or "taskset" not in extra_info or "task" not in extra_info:
        raise ValueError("the row has no verifiers task (extra_info.taskset and extra_info.task): not a generated row")
    config = _taskset_config(extra_info["taskset"], dict(extra_info.get("args") or {}))
    cls = task_type(extra_info["taskset"])
    return cls(cls.data_type().model_validate(extra_info["task"]), config.task)


def _new_trace(task: Any, agent: Any = None, name: str = "agent") -> Any:
    """A trace holding the task's system prompt and prompt, as verifiers' chat loop opens one."""
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import SystemMessage, UserMessage

    data = task.data
    trace = vf.Trace(
        task=TraceTask(type=type(task).__name__, data=data),
        agent=AgentInfo(config=agent or vf.AgentConfig(), name=name),
    )
    if data.system_prompt:
        _append(trace, SystemMessage(content=data.system_prompt))
    if data.prompt is not None:
        _append(trace, UserMessage(content=data.prompt_text))
    return trace


def _append(trace: Any, message: Any, sampled: bool = False) -> None:
    from verifiers.v1.graph import MessageNode

    parent = len(trace.nodes) - 1 if trace.nodes else None
    trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))


def _scores(trace: Any) -> dict[str, float]:
    """The trace's rewards by function and its metrics (`metric_<name>`), those that ran."""
    scores = {name: reward.score for name, reward in trace.rewards.items() if reward is not None}
    return scores | {f"metric_{name}": value for name, value in trace.metrics.items() if value is not None}


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    from verifiers.v1.types import AssistantMessage

    if isinstance(data_source, str) and "/" in data_source and not data_source.startswith("verifiers/"):
        return {"score": 0.0}  # a row of another environment in a mixed run: not this reward's to score
    task = _task(extra_info)
    trace = _new_trace(task)
    _append(trace, AssistantMessage(content=solution_str), sampled=True)
    asyncio.run(task.score(trace))
    return {"score": trace.reward, **_scores(trace)}


# --- episodes: multi-turn and tool environments -------------------------------------------------------------

_ENVS: dict[str, Any] = {}
_LOOP: asyncio.AbstractEventLoop | None = None
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOLS_NOTE = (
    'You can call these tools. To call one, write <tool_call>{"name": ..., "arguments": {...}}</tool_call> '
    "(one tag per call); each result comes back in <tool_response> tags. Reply without a call to give your answer."
)


def _loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop: every open episode's `run()` is a task on it, driven by reset and step
    one at a time (the sandbox serves its calls in turn)."""
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    return _LOOP


def _environment(taskset: str, args: dict, env_id: str, env_args: dict) -> Any:
    """The taskset's `Env` (or `env_id`'s), built once per process: an env is the same for every episode."""
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    key = json.dumps([taskset, args, env_id, env_args], sort_keys=True)
    if key not in _ENVS:
        config = resolve_env_config({**env_args, "id": env_id, "taskset": _taskset_config(taskset, args)})
        _ENVS[key] = load_environment(config)
    return _ENVS[key]


class _Tools:
    """One episode's toolsets on an in-process MCP server each: their schemas, and calls by qualified name."""

    def __init__(self, task: Any):
        self.toolsets = type(task).toolsets(task.config)
        self.servers: dict[str, tuple[Any, str]] = {}  # qualified name -> (server, the tool's own name)
        self.schemas: list[dict] = []
        self.task = task

    async def start(self) -> None:
        for toolset in self.toolsets:
            server = MCPServer(toolset.server_name or type(toolset).__name__)
            toolset.register(server)
            await toolset.setup()
            await toolset.setup_task(self.task)
            for tool in await server.list_tools():
                name = f"{toolset.server_name}_{tool.name}" if toolset.server_name else tool.name
                if name in self.servers:
                    raise ValueError(f"two toolsets offer a tool named {name!r}")
                self.servers[name] = (server, tool.name)
                self.schemas.append(
                    {"name": name, "description": tool.description or "", "parameters": tool.input_schema}
                )

    def note(self) -> str:
        return TOOLS_NOTE + "\n<tools>\n" + "\n".join(json.dumps(s) for s in self.schemas) + "\n</tools>"

    async def call(self, name: str, arguments: dict) -> str:
        if name not in self.servers:
            return f"Error: no tool named {name!r}; the tools are {', '.join(self.servers)}"
        server, own_name = self.servers[name]
        try:
            result = await server.call_tool(own_name, arguments)
        except Exception as exc:  # the tool's failure is the model's observation, as an MCP server reports it
            return f"Error: {exc}"
        return "\n".join(getattr(block, "text", None) or str(block) for block in result.content)


def _tool_calls(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """A reply's text outside its tool calls, and each call as (name, arguments) or ("", the reason it is not one)."""
    calls: list[tuple[str, Any]] = []
    for body in _TOOL_CALL.findall(text):
        try:
            call = json.loads(body)
            arguments = call.get("arguments", {}) if isinstance(call, dict) else None
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError as exc:
            calls.append(("", f"the call is not JSON ({exc})"))
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
            calls.append(("", 'a call is {"name": a tool\'s name, "arguments": an object}'))
            continue
        calls.append((call["name"], arguments))
    return _TOOL_CALL.sub("", text).strip(), calls


class _Interaction:
    """verifiers' `Interaction` for the policy's seat: each reply the seat needs is the engine's next step."""

    def __init__(self, seat: _Seat, task: Any):
        self.seat, self.task = seat, task
        self.trace = _new_trace(task, seat.config, seat.name)
        self.over = False
        self.tools = _Tools(task)

    async def __aenter__(self) -> _Interaction:
        await self.tools.start()
        self.trace.tools = [_tool(s) for s in self.tools.schemas]
        self.seat.traces.append(self.trace)
        return self

    async def __aexit__(self, kind: Any, error: Any, tb: Any) -> None:
        if kind is None:  # closing the exchange finishes the rollout: the task's own judgement on its trace
            self.trace.is_completed = True
            self.trace.stop_condition = self.trace.stop_condition or "user_closed"
            await self.task.score(self.trace)
            self.trace.ok = True

    async def turn(self, message: str | None = None) -> Any:
        """One harness segment: the user's message (if any), then replies until one calls no tool."""
        from verifiers.v1.types import AssistantMessage, ToolCall, ToolMessage, UserMessage

        if self.over:
            return vf.Segment(messages=[], terminated=True)
        produced: list[Any] = []
        observation = message
        if message is not None:
            _append(self.trace, UserMessage(content=message))
        while True:
            if self.seat.replies >= self.seat.max_turns:
                self.over = True
                self.trace.stop_condition = "max_turns"
                return vf.Segment(messages=produced, terminated=not produced)
            if self.tools.schemas and not self.seat.replies:
                observation = self.tools.note() + ("\n\n" + observation if observation else "")
            reply = await self.seat.episode.ask(observation)
            self.seat.replies += 1
            content, calls = _tool_calls(reply) if self.tools.schemas else (reply, [])
            ids = [f"call_{next(self.seat.call_ids)}" for _ in calls]
            tool_calls = [ToolCall(id=i, name=n or "invalid", arguments=json.dumps(a)) for i, (n, a) in zip(ids, calls)]
            assistant = AssistantMessage(content=content if calls else reply, tool_calls=tool_calls or None)
            _append(self.trace, assistant, sampled=True)
            produced.append(assistant)
            if not calls:
                return vf.Segment(messages=produced)
            results = []
            for call_id, (name, arguments) in zip(ids, calls):
                result = await self.tools.call(name, arguments) if name else f"Error: {arguments}"
                tool_message = ToolMessage(tool_call_id=call_id, content=result, name=name or None)
                _append(self.trace, tool_message)
                produced.append(tool_message)
                results.append(f"<tool_response>\n{result}\n</tool_response>")
            observation = "\n".join(results)


def _tool(schema: dict) -> Any:
    from verifiers.v1.types import Tool

    return Tool(name=schema["name"], description=schema["description"], parameters=schema["parameters"])


class _Seat:
    """verifiers' `Agent` for the policy: interactions whose replies are the run's model turns."""

    def __init__(self, episode: Verifiers, name: str, config: Any):
        self.episode, self.name, self.config = episode, name, config
        self.trainable = True
        self.replies = 0
        own = getattr(config, "max_turns", None)
        self.max_turns = min(episode.max_turns, own) if own else episode.max_turns
        self.traces: list[Any] = []  # its interactions' traces, in the order they opened
        self.call_ids = itertools.count()

    def interaction(self, task: Any) -> _Interaction:
        return _Interaction(self, task)

    async def run(self, task: Any) -> Any:
        """The single-agent case: the task's prompt, one segment (tool calls included), scored."""
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace


class Verifiers:
    """A verifiers environment played as the run's multi-turn environment (see the module's docstring)."""

    def __init__(
        self,
        taskset: str,
        args: dict | None = None,
        env: str = "",
        env_args: dict | None = None,
        max_turns: int = 4,
    ):
        if not isinstance(taskset, str) or not taskset:
            raise ValueError("taskset: a verifiers taskset id is required")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a whole number of at least 1, got {max_turns!r}")
        self.taskset, self.args, self.env_id = taskset, dict(args or {}), env
        self.env_args, self.max_turns = dict(env_args or {}), max_turns

    def reset(self, prompt: str, label: str | None, metadata: dict) -> dict:
        from verifiers.v1.configs.agent import agent_config_fields

        task = _task((metadata or {}).get("extra_info"))
        if metadata["extra_info"]["taskset"] != self.taskset:
            raise ValueError(
                f"the row is a task of taskset {metadata['extra_info']['taskset']!r}; this environment plays "
                f"{self.taskset!r}"
            )
        env = _environment(self.taskset, self.args, self.env_id, self.env_args)
        seats = list(agent_config_fields(env.config))
        if len(seats) != 1:
            raise ValueError(
                f"{type(env).__name__} declares {len(seats)} agents ({', '.join(seats)}): a run's policy plays one "
                "seat, and the others would need models of their own"
            )
        self.loop = _loop()
        self.asked: asyncio.Future = self.loop.create_future()
        self.reply: asyncio.Future | None = None
        self.agents = vf.Agents(env.config, make=lambda name, config: _Seat(self, name, config))
        self.seat: _Seat = getattr(self.agents, seats[0])
        self.running = self.loop.create_task(self._play(env, task))
        over, observation = self._advance()
        if over:
            raise ValueError(f"{type(env).__name__}.run() ended before the model's first turn")
        return {"observation": observation}

    async def _play(self, env: Any, task: Any) -> None:
        from verifiers.v1.episode import Episode
        from verifiers.v1.trace import TraceTask

        await env.setup(self.agents)
        await env.run(task, self.agents)
        traces = list(self.seat.traces)
        episode = Episode(task=TraceTask(type=type(task).__name__, data=task.data), traces=traces, ok=True)
        await env.finalize(task, episode)

    async def ask(self, observation: str | None) -> str:
        """The seat's request for the model's next reply: the engine's step answers it."""
        self.reply = self.loop.create_future()
        self.asked.set_result(observation)
        return await self.reply

    def _advance(self) -> tuple[bool, str | None]:
        """Runs `run()` until the seat asks for a reply (False, the observation) or it returns (True, None)."""
        self.loop.run_until_complete(asyncio.wait({self.running, self.asked}, return_when=asyncio.FIRST_COMPLETED))
        if self.asked.done():
            observation = self.asked.result()
            self.asked = self.loop.create_future()
            return False, observation
        self.running.result()  # the environment's own error, if it failed
        return True, None

    def step(self, action: str) -> dict:
        assert self.reply is not None  # reset asked for the first reply
        self.reply.set_result(action)
        over, observation = self._advance()
        if not over:
            return {"observation": observation, "reward": 0.0, "done": False}
        if not self.seat.traces:
            raise ValueError("the environment's run() opened no interaction for the policy")
        trace = self.seat.traces[-1]
        return {"observation": None, "reward": float(trace.reward), "done": True, "logs": _scores(trace)}

    def close(self) -> None:
        """The episode is dropped (ended, or failed): its `run()` is cancelled rather than left waiting."""
        running = getattr(self, "running", None)
        if running is not None and not running.done():
            running.cancel()
            self.loop.run_until_complete(asyncio.gather(running, return_exceptions=True))


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "generate":
        print("usage: verifiers_tasksets.py generate SPEC_JSON FD", file=sys.stderr)
        return 2
    spec, fd = json.loads(argv[1]), int(argv[2])
    with os.fdopen(fd, "w") as out:
        try:
            rows = generate(spec)
        except Exception as exc:  # the parent reads the reason from the same channel
            out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            return 1
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
