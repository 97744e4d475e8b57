"""An example external agent for the demo's arithmetic task, driving a run through the engine's
OpenAI-compatible endpoint (`rl_engine/agent_endpoint/`) with the official `openai` client.

Each session: ask the model the task; if it replies with a calculator call such as ``37+48``,
answer ``=85`` as a user message and ask again (up to `--calls` times); the reward is 1 when the
final reply equals the task's label. Several sessions run at once, so the engine batches them.

    python rl_engine/environments/arithmetic_agent.py --url http://127.0.0.1:PORT --token TOKEN [--workers 4]
    # (the run's own token: its run folder's agent_token file)
    # or let the engine start it in its sandbox (it sets POSTTRAIN_AGENT_URL and POSTTRAIN_AGENT_TOKEN):
    # agent: {command: "python rl_engine/environments/arithmetic_agent.py",
    #         files: [rl_engine/environments/arithmetic_agent.py]}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from openai import APIConnectionError, OpenAI

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

CALL = re.compile(r"^\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*=?\s*$")


def post(url: str, body: dict, token: str) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def calculate(match: re.Match) -> int:
    left, op, right = int(match.group(1)), match.group(2), int(match.group(3))
    return left + right if op == "+" else left - right if op == "-" else left * right


def play(task: dict, calls: int, token: str) -> float:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": task["prompt"]}]
    reply = ""
    # Closed with the session: a client left to the garbage collector keeps its connection open, and in the
    # sandbox each open connection is a socat process counted against its process limit.
    with OpenAI(base_url=task["base_url"], api_key=token, max_retries=0) as client:  # api_key: the bearer token
        for _ in range(calls + 1):
            completion = client.chat.completions.create(model=task["model"], messages=messages, max_tokens=8)
            reply = completion.choices[0].message.content or ""
            call = CALL.match(reply)
            if call is None:
                break
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"={calculate(call)}"}]
    return 1.0 if reply.strip() == (task["label"] or "").strip() else 0.0


def worker(url: str, token: str, calls: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            status, task = post(f"{url}/sessions", {}, token)
            if status == 410:  # the run is over
                stop.set()
                return
            if status != 200:  # between steps, or the endpoint is busy: ask again
                time.sleep(0.2)
                continue
            reward = play(task, calls, token)
            post(f"{url}/sessions/{task['session_id']}/finish", {"reward": reward}, token)
        except (OSError, APIConnectionError) as exc:
            # A dropped connection costs this session (the step expires it), never the worker.
            print(f"agent: {type(exc).__name__}: {exc}; asking for the next task", flush=True)
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("POSTTRAIN_AGENT_URL"), help="the engine's agent endpoint")
    parser.add_argument(
        "--token", default=os.environ.get("POSTTRAIN_AGENT_TOKEN"), help="the run's own token for its endpoint"
    )
    parser.add_argument("--workers", type=int, default=4, help="sessions played at once")
    parser.add_argument("--calls", type=int, default=1, help="calculator calls allowed per session")
    args = parser.parse_args()
    if not args.url:
        parser.error("--url or POSTTRAIN_AGENT_URL is required")
    if not args.token:
        parser.error("--token or POSTTRAIN_AGENT_TOKEN is required (the run folder's agent_token file)")
    stop = threading.Event()
    threads = [
        threading.Thread(target=worker, args=(args.url.rstrip("/"), args.token, args.calls, stop), daemon=True)
        for _ in range(args.workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
