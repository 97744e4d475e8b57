"""An external agent program as the executor: while a run trains, the engine serves an
OpenAI-compatible endpoint backed by the run's rollout engine, and every finished agent session
becomes one training trajectory with the reward the agent reports.

The protocol (all JSON; `http://HOST:PORT` is logged at the start of the run; `agent.command` runs in
the sandbox of rl_engine/sandbox/, without network, and gets POSTTRAIN_AGENT_URL=http://127.0.0.1:PORT,
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

from rl_engine.agent_endpoint.executor import TASK_WAIT_S, AgentExecutor
from rl_engine.agent_endpoint.launcher import start_agent
from rl_engine.agent_endpoint.protocol import TOKEN_ENV, TOKEN_FILE, AgentError, Completion, stream_chunks
from rl_engine.agent_endpoint.server import ENDPOINT_BACKLOG

__all__ = [
    "ENDPOINT_BACKLOG",
    "TASK_WAIT_S",
    "TOKEN_ENV",
    "TOKEN_FILE",
    "AgentError",
    "AgentExecutor",
    "Completion",
    "start_agent",
    "stream_chunks",
]
