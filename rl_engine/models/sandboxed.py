"""A GGUF converted in the engine's sandbox (rl_engine/sandbox/): the file is untrusted input, and turning it into
a model runs third-party parsers and dequantizers over it (gguf, tokenizers, transformers, vLLM).

`convert_gguf(source, folder, options)`:

1. reads the header here with bounded reads (rl_engine/models/gguf.py, our own parser, no third-party code) and
   refuses a file that is not a GGUF, is truncated, declares too much, or stores a tensor type transformers
   cannot dequantize, before anything starts;
2. runs `gguf.py convert` in a sandbox: the GGUF bound in read-only (not copied: it may be many GiB), `folder`
   bound in writable (the only place it may write besides its /tmp), no network, under a memory cap (the
   sandbox's cgroup, and each process's address space), a CPU quota, a deadline, and a cap on each file it
   writes (the model's size in the target dtype, from the header);
3. accepts what it wrote only as plain files with plain names in one folder, `folder/model` (no link, no
   subfolder, nothing the size of the header does not allow), handed back to this user (the sandbox's user is
   `nobody` when we are root).

It returns the converter's report (the header's summary, the dtype, the check's answers); GGUFError says why not.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_engine.models import gguf
from rl_engine.models.gguf import GGUFError, GGUFHeader, check_dequantizable, read_header
from rl_engine.sandbox import SANDBOX_UID, Limits, ReportTooLarge, Sandbox, died_by_signal, run_reporting

CONVERTER = Path(gguf.__file__)
MODEL_FOLDER = "model"  # what the converter writes inside the folder it is given
INSIDE_SOURCE = "/input/model.gguf"
INSIDE_OUTPUT = "/output"
REPORT_MAX_BYTES = 1 << 20
# A file the converter may write, by name: weights, config, tokenizer, chat template (nothing hidden, no path).
OUTPUT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SLACK_BYTES = 64 << 20  # configs, and the safetensors headers
# The host's CPU and NUMA layout (read-only): what lscpu reads, which vLLM's CPU backend runs to bind its threads.
CPU_TOPOLOGY = ("/sys/devices/system/cpu", "/sys/devices/system/node")


@dataclass(frozen=True)
class ConvertOptions:
    dtype: str = "float32"
    memory_mb: int = 16384  # the sandbox's memory, and each process's address space
    timeout_s: float = 3600.0
    cpus: float = 2.0
    check_prompt: str = "What is the capital of France?"
    check_tokens: int = 8
    check_vllm: bool = False
    tmp_mb: int = 1024  # the sandbox's /tmp and /dev/shm (vLLM's CPU backend keeps files there)


def convert_gguf(source: Path, folder: Path, options: ConvertOptions) -> dict[str, Any]:
    """Converts the GGUF `source` into `folder/model` (folder: empty, ours); returns the converter's report."""
    header = read_header(source)
    check_dequantizable(header)
    most = output_bytes(header, options.dtype)
    report = _run(source, folder, options, most)
    _accept(folder, most)
    return report


def output_bytes(header: GGUFHeader, dtype: str) -> int:
    """The most a faithful conversion writes: every value in `dtype`, the vocabulary again, and some slack."""
    return header.parameter_count * DTYPE_BYTES[dtype] + header.data_start * 2 + SLACK_BYTES


def _run(source: Path, folder: Path, options: ConvertOptions, most: int) -> dict[str, Any]:
    threads = max(1, math.ceil(options.cpus))
    limits = Limits(
        memory_mb=options.memory_mb,
        processes=64 + 8 * threads,  # torch's and tokenizers' thread pools, vLLM's
        cpu_s=int(options.timeout_s * threads) + 60,
        cpus=options.cpus,
        open_files=4096,
        file_mb=math.ceil(most / (1 << 20)),
        tmp_mb=options.tmp_mb,
    )
    box = Sandbox.create(limits)
    script = box.add_file(CONVERTER)
    inside_source = box.add_bind(source, INSIDE_SOURCE)
    inside_output = box.add_bind(folder, INSIDE_OUTPUT, writable=True)
    if options.check_vllm:
        for topology in CPU_TOPOLOGY:  # vLLM's CPU backend places its threads by it (lscpu)
            if Path(topology).is_dir():
                box.add_bind(topology, topology)
    if box.sandboxed and os.geteuid() == 0:
        # The command runs as nobody: it reads the file (ours, in a private folder) and writes the folder.
        os.chmod(source, 0o644)
        os.chown(folder, SANDBOX_UID, SANDBOX_UID)
    command = [
        sys.executable,
        "-I",
        script,
        "convert",
        inside_source,
        f"{inside_output}/{MODEL_FOLDER}",
        "--dtype",
        options.dtype,
        "--check-prompt",
        options.check_prompt,
        "--check-tokens",
        str(options.check_tokens),
        *(["--vllm"] if options.check_vllm else []),
    ]
    try:
        done = run_reporting(
            box,
            lambda fd: [*command, "--report-fd", str(fd)],
            timeout_s=options.timeout_s,
            max_bytes=REPORT_MAX_BYTES,
            label="gguf-convert",
            env=_environment(threads),
        )
    except TimeoutError:
        raise GGUFError(f"the conversion did not finish within {options.timeout_s:g} s") from None
    except ReportTooLarge:
        raise GGUFError("the converter wrote an oversized report") from None
    return _outcome(done.data, done.returncode, done.tail, options, box.sandboxed)


def _environment(threads: int) -> dict[str, str]:
    """Offline, quiet, and as many threads as the sandbox has cores."""
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": "/tmp/hf",
        "VLLM_CACHE_ROOT": "/tmp/vllm",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TRANSFORMERS_VERBOSITY": "error",
        "TQDM_DISABLE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


def _outcome(data: bytes, returncode: int | None, tail: str, options: ConvertOptions, sandboxed: bool) -> dict:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        report = None
    if isinstance(report, dict) and report.get("ok") is True and returncode == 0:
        return report
    if isinstance(report, dict) and isinstance(report.get("error"), str):
        raise GGUFError(report["error"][:2000])
    signal = died_by_signal(returncode, sandboxed)
    if signal == 9:
        raise GGUFError(
            f"the conversion was killed, most likely for going over its memory ({options.memory_mb} MiB)"
            + (f": {tail}" if tail else "")
        )
    raise GGUFError(f"the conversion failed (exit code {returncode})" + (f": {tail}" if tail else ""))


def _accept(folder: Path, most: int) -> None:
    """What the sandbox wrote, checked as a model folder of plain files before anything here reads it, and made
    this user's: a link or a hard link could lead a later read to a file of the host's."""
    entries = list(folder.iterdir())
    model = folder / MODEL_FOLDER
    if [entry.name for entry in entries] != [MODEL_FOLDER] or not stat.S_ISDIR(model.lstat().st_mode):
        raise GGUFError("the converter left something other than one model folder")
    total = 0
    files = list(model.iterdir())
    for file in files:
        info = file.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or not OUTPUT_NAME.fullmatch(file.name):
            raise GGUFError(f"the converter wrote {file.name!r}, which is not a plain file of a model folder")
        total += info.st_size
    if total > most:
        raise GGUFError(f"the converter wrote {total} bytes, more than the model's {most} can be")
    for path in (folder, model, *files):  # plain files and folders only (checked above), the sandbox gone
        if os.geteuid() == 0:
            os.chown(path, os.getuid(), os.getgid())
        os.chmod(path, 0o644 if path in files else 0o755)
