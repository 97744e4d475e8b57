"""The rollout store at scale: a production-shaped run's rollouts written as one Parquet file per step (as
the engine writes them) and queried in place with DuckDB through the platform's own reads
(posttrain.telemetry.rollouts), with and without per-token views. Prints JSON.

    python bench/rollout_store.py                 # 500 steps x 2,048 rollouts of 4,000 characters (a quiet machine)
    python bench/rollout_store.py --smoke         # 5 steps x 64 rollouts of 400 characters (seconds)

Figures: bytes per byte of text, the index row a step adds (the samples event's data, what Postgres keeps),
the engine's cost of storing a step (building the table, compressing, writing; on the writer's thread), a
worker's cost of building a step's search index and its size, a step's first page, a reward filter, a text
search (a word found in a few rollouts per step, and one in none, with the index and without it: every
response read) and the same prompt across every step, the web side's CPU to validate a
samples event, and this process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "platform", ROOT / "sdk"):  # the checkout's own `bench`, engine, platform and SDK
    sys.path.insert(0, str(path))


def words(rng: np.random.Generator, size: int) -> np.ndarray:
    """A Zipf vocabulary of pseudo-words: text that compresses like prose rather than random bytes."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(size)])


def text(rng: np.random.Generator, vocab: np.ndarray, p: np.ndarray, chars: int) -> str:
    return " ".join(vocab[rng.choice(len(vocab), size=chars // 5 + 1, p=p)])[:chars]


def step_table(step, args, rng, vocab, p, prompts):
    import pyarrow as pa

    from posttrain_sdk import rollout_files

    n = args.rollouts
    records = [
        {
            "index": i,
            "group": i // args.group,
            "prompt": prompts[(step * n // args.group + i // args.group) % len(prompts)],
            "response": text(rng, vocab, p, args.chars) + (" needle" if i % 512 == 7 else ""),
            "label": "42",
            "reward": float(rng.random()),
            "components": {"exact": float(rng.random() > 0.5)},
            "advantage": float(rng.normal()),
            "length": args.chars // 4,
            "finish_reason": "stop" if i % 10 else "length",
            "kept": True,
        }
        for i in range(n)
    ]
    columns = {}
    if args.tokens:
        t = args.tokens
        offsets = pa.array(np.arange(0, (n + 1) * t, t, dtype=np.int32))
        ids = pa.array(rng.integers(0, 150_000, n * t, dtype=np.int32))
        columns["token_ids"] = pa.ListArray.from_arrays(offsets, ids)
        for name in ("rollout_logprob", "trainer_logprob", "entropy", "token_advantage"):
            values = pa.array(rng.normal(size=n * t).astype(np.float32))
            columns[name] = pa.ListArray.from_arrays(offsets, values)
    return rollout_files.rows_table(records, step, columns)


def timed(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(args: argparse.Namespace, folder: Path) -> dict:
    os.environ["POSTTRAIN_ROLLOUT_STORE"] = str(folder)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "posttrain.settings")
    import django

    django.setup()
    from posttrain.telemetry import rollout_index, rollouts
    from posttrain.telemetry.event_schema import parse_batch
    from posttrain_sdk import rollout_files

    rng = np.random.default_rng(0)
    vocab = words(rng, 20_000)
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    p /= p.sum()
    prompts = [text(rng, vocab, p, 300) for _ in range(4096)]
    run_id = "00000000-0000-0000-0000-000000000001"
    target = rollouts.rollout_folder(run_id)
    store_seconds, index_seconds, text_bytes, files, events = [], [], 0, [], []
    for step in range(1, args.steps + 1):
        table = step_table(step, args, rng, vocab, p, prompts)
        started = time.perf_counter()
        info = rollout_files.write_step(target, table, step=step)
        store_seconds.append(time.perf_counter() - started)
        text_bytes += sum(len(s) for c in ("prompt", "response") for s in table.column(c).to_pylist())
        started = time.perf_counter()
        rollouts.rollout_index_build(run_id, info.name)  # a worker's, after the samples event
        index_seconds.append(time.perf_counter() - started)
        files.append(rollouts.StoredFile(run_id, step, 0, info.name, info.rows, info.sha256, info.bytes))
        events.append(
            {"run": run_id, "seq": step, "type": "samples", "step": step, "time": 0.0, "data": info.event_data()}
        )
    stored = sum((folder / "runs" / run_id / "rollouts" / f.name).stat().st_size for f in files)
    indexed = sum(p.stat().st_size for p in (folder / "runs" / run_id / rollout_index.FOLDER).iterdir())
    web_cpu = timed(lambda: parse_batch({"events": events[-1:]}, run_id), repeat=20)

    def query(**filters):
        return lambda: list(
            rollouts.rollouts_query([run_id], filters=rollouts.RolloutFilter(**filters), limit=50, files=files)
        )

    def unindexed(**filters):  # every file read: what a search costs before its files are indexed
        bare = [rollouts.StoredFile(f.run_id, f.step, f.part, f.name, f.rows) for f in files]
        return lambda: list(
            rollouts.rollouts_query([run_id], filters=rollouts.RolloutFilter(**filters), limit=50, files=bare)
        )

    prompt = prompts[0]
    return {
        "config": {k: getattr(args, k) for k in ("steps", "rollouts", "chars", "tokens", "group")},
        "rollouts": args.steps * args.rollouts,
        "bytes_per_text_byte": round(stored / text_bytes, 3),
        "index_row_bytes_per_step": len(json.dumps(events[-1]["data"])),
        "search_index_bytes_per_text_byte": round(indexed / text_bytes, 4),
        "engine_store_s_per_step_median": round(statistics.median(store_seconds), 4),
        "search_index_build_s_per_step_median": round(statistics.median(index_seconds), 4),
        "first_page_of_a_step_s": round(timed(query(steps=[args.steps])), 4),
        "reward_filter_all_steps_s": round(timed(query(min_reward=0.99)), 4),
        "text_search_found_s": round(timed(query(q="NEEDLE")), 4),
        "text_search_absent_s": round(timed(query(q="zzqqxx")), 4),
        "text_search_absent_unindexed_s": round(timed(unindexed(q="zzqqxx"), repeat=1), 4),
        "same_prompt_all_steps_s": round(
            timed(
                lambda: list(
                    rollouts.rollouts_query(
                        [run_id],
                        filters=rollouts.RolloutFilter(prompt=prompt),
                        columns=("step", "index"),
                        limit=rollouts.MAX_SAME_PROMPT,
                        files=files,
                    )
                )
            ),
            4,
        ),
        "web_cpu_validate_samples_event_s": round(web_cpu, 6),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rollouts", type=int, default=2048)
    parser.add_argument("--chars", type=int, default=4000)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=0, help="per-token view length (0: none; 1024 in the issue)")
    parser.add_argument("--smoke", action="store_true", help="5 steps x 64 rollouts of 400 characters")
    parser.add_argument("--dir", help="where the files go (default: a temporary folder, removed)")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rollouts, args.chars = 5, 64, 400
        args.tokens = min(args.tokens, 64)
    from bench._machine import MachineLoad

    machine = MachineLoad()
    load = {"load_avg_start": os.getloadavg(), "cpus": os.cpu_count()}
    if args.dir:
        result = run(args, Path(args.dir))
    else:
        with tempfile.TemporaryDirectory(prefix="rollout-store-") as tmp:
            result = run(args, Path(tmp))
    print(json.dumps({**result, **load, "load_avg_end": os.getloadavg(), "machine": machine.report()}, indent=1))


if __name__ == "__main__":
    main()
