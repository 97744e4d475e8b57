"""The agent's command started in the sandbox without network, reaching the endpoint through socat on a Unix
socket (or, without a sandbox, as a plain child on the endpoint's TCP port)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from rl_engine.agent_endpoint.protocol import TOKEN_ENV
from rl_engine.config import AgentConfig
from rl_engine.sandbox import Limits, Sandbox, SandboxProcess, SandboxUnavailable, python_runtime

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
    """`command` (the config's `agent.command`) in the sandbox (rl_engine/sandbox/): the endpoint at
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
