"""Remote reward server, speaking OpenRLHF's remote reward protocol unchanged.

Request: ``POST url`` with JSON ``{"query": [...], "prompts": [...], "labels": [...]}``
(``query`` holds prompt+response, one entry per sample). Response: JSON
``{"rewards": [...], "scores": [...], "extra_logs": {...}}``; a bare list of rewards and
``{"rewards": [...]}`` alone are accepted too (see ``base.parse_openrlhf_output``).

Failures never raise out of ``score``: the samples of the request that failed get 0.0 and an
error such as ``"POST http://host/score failed after 4 attempts: HTTP 503 Service
Unavailable (a 12-byte answer)"``, so one flaky server degrades a step (a step where most samples
fail fails the run: rewards.max_error_rate). An answer's body is never quoted: its status and size only.

Every request goes through the outbound policy (rl_engine/outbound.py): the URL's host is resolved and
checked at each request and the connection goes to that address (loopback, private, link-local and the
cluster's own addresses are refused unless an admin allowed them); redirects are not followed; an
answer is at most ``max_response_bytes``.

- ``retries`` is the number of *extra* attempts after the first (3 -> up to 4 attempts), with
  exponential backoff ``backoff_s * 2**k`` between them (0.5 s, 1 s, 2 s by default).
- Retried: connection errors, timeouts, HTTP 408/425/429 and 5xx. Not retried (they would fail
  the same way again): other HTTP 4xx, a body that is not JSON, a wrong number of rewards.
- ``timeout_s`` bounds one whole request: connecting, sending and reading the answer.
- ``batch_size`` splits a large batch into requests of at most that many samples, sent
  concurrently (up to ``MAX_CONCURRENT_REQUESTS`` at once); each fails on its own.
"""

from __future__ import annotations

import http
import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from rl_engine.outbound import MAX_RESPONSE_BYTES, OutboundFailed, OutboundPolicy, OutboundRefused, post
from rl_engine.rewards.base import ComponentResult, RewardBatch, parse_openrlhf_output

MAX_CONCURRENT_REQUESTS = 8
RETRY_STATUSES = frozenset({408, 425, 429}) | frozenset(range(500, 600))


class _Permanent(Exception):
    """A failure that retrying cannot fix."""


class _Transient(Exception):
    """A failure worth another attempt."""


class HttpReward:
    def __init__(
        self,
        url: str,
        name: str = "http",
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        batch_size: int | None = None,
        headers: dict[str, str] | None = None,
        policy: OutboundPolicy | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ):
        parsed = urllib.parse.urlparse(url or "")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"url: expected an http:// or https:// URL, got {url!r}")
        if timeout_s is None or timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")
        if retries is None or retries < 0:
            raise ValueError("retries: must be >= 0")
        if backoff_s is None or backoff_s < 0:
            raise ValueError("backoff_s: must be >= 0")
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size: must be >= 1")
        self.name = name
        self.url = url
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.batch_size = batch_size
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
        self.policy = policy if policy is not None else OutboundPolicy.from_env()
        self.max_response_bytes = int(max_response_bytes)

    def score(self, batch: RewardBatch) -> ComponentResult:
        n = len(batch)
        if n == 0:
            return ComponentResult.ok([])
        size = self.batch_size or n
        chunks = [(start, min(start + size, n)) for start in range(0, n, size)]
        if len(chunks) == 1:
            return self._post_chunk(batch, 0, n)
        with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT_REQUESTS, len(chunks))) as pool:
            results = list(pool.map(lambda c: self._post_chunk(batch, *c), chunks))
        return _merge(results, [end - start for start, end in chunks])

    def _post_chunk(self, batch: RewardBatch, start: int, end: int) -> ComponentResult:
        try:
            return self._post_chunk_with_retries(batch, start, end)
        except Exception as exc:  # e.g. labels that cannot be encoded as JSON; never raise out of score
            return ComponentResult.failed(end - start, f"POST {self.url} failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        pass  # one connection per request: nothing held open

    def _post_chunk_with_retries(self, batch: RewardBatch, start: int, end: int) -> ComponentResult:
        n = end - start
        body = json.dumps(
            {"query": batch.queries[start:end], "prompts": batch.prompts[start:end], "labels": batch.labels[start:end]}
        ).encode()
        attempts = self.retries + 1
        last = "no attempt made"
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                payload = self._post_once(body)
            except _Permanent as exc:
                return ComponentResult.failed(n, f"POST {self.url} failed: {exc}")
            except _Transient as exc:
                last = str(exc)
                continue
            try:
                return parse_openrlhf_output(payload, n, what="rewards")
            except ValueError as exc:
                return ComponentResult.failed(n, f"POST {self.url}: server {exc}")
        return ComponentResult.failed(n, f"POST {self.url} failed after {attempts} attempts: {last}")

    def _post_once(self, body: bytes) -> object:
        try:
            target = self.policy.check_url(self.url)  # resolved now, connected to as checked
            response = post(target, body, self.headers, timeout_s=self.timeout_s, max_bytes=self.max_response_bytes)
        except OutboundRefused as exc:
            raise _Permanent(f"refused by the outbound policy: {exc}") from None
        except OutboundFailed as exc:
            raise _Transient(str(exc)) from None
        size = f"a {len(response.body)}-byte answer"
        status = f"HTTP {response.status} {_phrase(response.status)}".rstrip()  # not the server's own words
        if 300 <= response.status < 400:
            raise _Permanent(f"{status} ({size}): redirects are not followed")
        if response.status >= 400:
            text = f"{status} ({size})"
            if response.status in RETRY_STATUSES:
                raise _Transient(text)
            raise _Permanent(text)
        try:
            return json.loads(response.body)
        except ValueError:
            raise _Permanent(f"response is not JSON ({size})") from None


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _merge(results: list[ComponentResult], sizes: list[int]) -> ComponentResult:
    """Concatenate chunk results; per-chunk scalar curves become per-sample values so the mean
    over the batch weights every sample equally."""
    scores: list[float] = []
    errors: list[str | None] = []
    extra: dict[str, list[float]] = {}
    for result, size in zip(results, sizes):
        scores.extend(result.scores)
        errors.extend(result.errors)
        for key, value in result.extra_logs.items():
            values = value if isinstance(value, list) else [value] * size
            extra.setdefault(key, []).extend(values)
    return ComponentResult(scores, errors, extra)
