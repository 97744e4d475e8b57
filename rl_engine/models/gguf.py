"""A GGUF model (llama.cpp's single-file format) turned into an ordinary Hugging Face model folder.

    python -m rl_engine.models.gguf header MODEL.gguf
    python -m rl_engine.models.gguf convert MODEL.gguf OUT --dtype float32 [--check-prompt TEXT] [--vllm]
    python -m rl_engine.models.gguf dtype

- `read_header` reads the header with bounded reads (our own parser, standard library only): the magic, the
  version, the metadata and the tensor table, each count, string and array checked against `HeaderLimits`
  before it is read, and every tensor's data checked to lie inside the file. `check_dequantizable` refuses a
  tensor type transformers cannot dequantize, naming the tensor.
- `convert` has transformers dequantize the file (an architecture it knows, or a refusal listing those it
  knows), builds a plain model from the config without the GGUF quantization, and saves it in `dtype` as
  safetensors with the config, the generation config and the tokenizer (its chat template included), into
  a folder renamed into place once whole.
- `answer` loads the folder with transformers and answers one prompt (greedy, through its chat template);
  `answer_vllm` does the same with vLLM.
- `--dtype auto` (the command line only) is the dtype this machine trains in (rl_engine/host_dtype.py); the
  sandboxed conversion is always given a dtype.

This file runs in the engine's sandbox, copied in alone (rl_engine/models/sandboxed.py): it imports nothing of
the engine, only the standard library at import time, and torch and transformers inside the functions that
convert and check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MAGIC = b"GGUF"
PREAMBLE_BYTES = 8  # the magic and the version
VERSIONS = (2, 3)  # version 1 counted in 32 bits; transformers and llama.cpp read 2 and 3
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME_BYTES = 64  # GGML_MAX_NAME
MAX_KEY_BYTES = 65_535  # the GGUF spec's limit on a metadata key
MAX_ELEMENTS = 1 << 48  # per tensor: far above any model's, below what overflows the byte arithmetic
DTYPES = ("float32", "bfloat16", "float16")

# ggml's tensor types: id -> (name, values per block, bytes per block). The GGUF spec's table, kept here so that
# reading a header needs no third-party code (tests/unit/engine/test_gguf.py checks it against the gguf package).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
# The types transformers' GGUF loader turns back into floats (through the gguf package's dequantizers); the
# rest (Q8_1, Q8_K: llama.cpp's intermediate types; integer and F64 tensors; Q1_0) it cannot.
DEQUANTIZABLE = frozenset(
    {
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
        "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
        "MXFP4", "NVFP4",
    }
)  # fmt: skip

# Metadata value types: id -> (struct format, width); 8 is a string and 9 an array.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9
_READ_BUFFER = 1 << 20

# transformers' GGUF table names a few architectures otherwise than llama.cpp writes them in the file.
_TRANSFORMERS_NAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
}
# Entries of that table that are not a causal language model's architecture.
_NOT_CAUSAL_LMS = frozenset({"general", "tokenizer", "t5", "t5encoder", "umt5"})


class GGUFError(ValueError):
    """The file is not a GGUF this importer converts; the message says what and where (a byte offset, a
    tensor's name, a metadata key)."""


@dataclass(frozen=True)
class HeaderLimits:
    """What a header may hold before it is refused as corrupt or hostile (real models stay far below)."""

    header_bytes: int = 256 << 20  # metadata and tensor table together (a 256k-token vocabulary is ~10 MiB)
    tensors: int = 65_536  # a 671B mixture of experts has ~1,100
    metadata: int = 65_536  # a model has a few dozen keys
    string_bytes: int = 16 << 20  # one string (a chat template is a few KiB)
    array_items: int = 64 << 20  # numeric array items (token scores and types)
    string_items: int = 4 << 20  # string array items (a vocabulary, its merges)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str
    shape: tuple[int, ...]  # torch's order (the file stores the fastest-moving dimension first)
    start: int  # byte offset of its data in the file
    nbytes: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    file_size: int
    alignment: int
    data_start: int
    metadata: dict[str, Any]  # scalars and strings; an array as {"array": item type, "length": n}
    tensors: tuple[TensorInfo, ...]

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    @property
    def model_name(self) -> str:
        name = self.metadata.get("general.name")
        return name if isinstance(name, str) else ""

    @property
    def parameter_count(self) -> int:
        return sum(tensor.elements for tensor in self.tensors)

    @property
    def quantization(self) -> dict[str, int]:
        """How many tensors each type stores, the commonest first: {"Q4_1": 211, "F32": 61}."""
        return dict(Counter(tensor.type_name for tensor in self.tensors).most_common())

    def summary(self) -> dict[str, Any]:
        """What the registry records of the file (JSON)."""
        context = self.metadata.get(f"{self.architecture}.context_length")
        tokenizer = self.metadata.get("tokenizer.ggml.model")
        return {
            "gguf_version": self.version,
            "architecture": self.architecture,
            "model_name": self.model_name[:200],
            "quantization": self.quantization,
            "tensors": len(self.tensors),
            "parameters": self.parameter_count,
            "context_length": context if isinstance(context, int) else None,
            "tokenizer": tokenizer[:100] if isinstance(tokenizer, str) else None,
            "size_bytes": self.file_size,
        }


# --- reading the header ------------------------------------------------------------------------------------------


class _Cursor:
    """Reads the file front to back, refusing any read past its end (truncated) or past the header's bound."""

    def __init__(self, handle: IO[bytes], size: int, limit: int) -> None:
        self.handle, self.size, self.limit, self.pos = handle, size, limit, 0

    def _check(self, n: int, what: str) -> None:
        end = self.pos + n
        if end > self.size:
            raise GGUFError(f"truncated: {what} (at byte {self.pos}) runs past the end of the file ({self.size} bytes)")
        if end > self.limit:
            raise GGUFError(
                f"{what} (at byte {self.pos}) lies past the first {_mib(self.limit)} of the file, where the "
                "header must have ended: the file is corrupt, or its metadata far larger than any model's"
            )

    def take(self, n: int, what: str) -> bytes:
        self._check(n, what)
        data = self.handle.read(n)
        if len(data) != n:  # the file shrank while being read
            raise GGUFError(f"truncated: {what} (at byte {self.pos}) could not be read whole")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        self._check(n, what)
        self.handle.seek(n, os.SEEK_CUR)
        self.pos += n

    def scalar(self, fmt: str, width: int, what: str) -> Any:
        return struct.unpack(fmt, self.take(width, what))[0]

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", 8, what))

    def _length(self, what: str, most: int) -> int:
        start = self.pos
        length = self.u64(f"the length of {what}")
        if length > most:
            raise GGUFError(f"{what} (at byte {start}) is {length} bytes long; at most {most} are read")
        return length

    def string(self, what: str, most: int) -> str:
        length = self._length(what, most)
        start = self.pos
        try:
            return self.take(length, what).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{what} (at byte {start}) is not UTF-8 text") from None

    def skip_string(self, what: str, most: int) -> None:
        self.skip(self._length(what, most), what)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def read_header(path: str | os.PathLike[str], limits: HeaderLimits | None = None) -> GGUFHeader:
    """The file's header, checked: GGUFError says what is wrong and where. Reads at most `limits.header_bytes`,
    never more than `limits.string_bytes` at once, and none of the tensor data."""
    limits = limits or HeaderLimits()
    with open(path, "rb", buffering=_READ_BUFFER) as handle:
        size = os.fstat(handle.fileno()).st_size
        cursor = _Cursor(handle, size, limits.header_bytes)
        version = _read_preamble(cursor)
        tensor_count = _count(cursor, "tensors", limits.tensors)
        metadata_count = _count(cursor, "metadata entries", limits.metadata)
        metadata = _read_metadata(cursor, metadata_count, limits)
        tables = [_read_tensor_info(cursor, index) for index in range(tensor_count)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment % 8:
        raise GGUFError(f"metadata 'general.alignment' is {alignment!r}; it must be a positive multiple of 8")
    if not isinstance(metadata.get("general.architecture"), str) or not metadata["general.architecture"]:
        raise GGUFError("the metadata names no architecture ('general.architecture' is missing or not text)")
    if not tables:
        raise GGUFError("the file holds no tensors")
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = tuple(_placed(entry, data_start, alignment, size) for entry in tables)
    _refuse_overlaps(tensors)
    return GGUFHeader(version, size, alignment, data_start, metadata, tensors)


def _read_preamble(cursor: _Cursor) -> int:
    version = check_preamble(cursor.handle.read(PREAMBLE_BYTES))
    cursor.pos = PREAMBLE_BYTES
    return version


def check_preamble(head: bytes) -> int:
    """The version of the GGUF whose first bytes are `head` (PREAMBLE_BYTES of them): GGUFError for a file that is
    not a GGUF, or one of a version or byte order transformers does not read. A first look at an upload."""
    if head[:4] != MAGIC:
        shown = " ".join(f"{b:02x}" for b in head[:4]) or "nothing"
        raise GGUFError(f"not a GGUF file: it starts with {shown}, not the magic bytes 47 47 55 46 ('GGUF')")
    if len(head) < PREAMBLE_BYTES:
        raise GGUFError(f"truncated: the file ends at byte {len(head)}, before the GGUF version")
    (version,) = struct.unpack("<I", head[4:PREAMBLE_BYTES])
    if version in VERSIONS:
        return int(version)
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if swapped in VERSIONS:
        raise GGUFError(f"a big-endian GGUF (version {swapped}): transformers reads little-endian files only")
    raise GGUFError(f"GGUF version {version}: transformers reads versions {' and '.join(map(str, VERSIONS))}")


def _count(cursor: _Cursor, what: str, most: int) -> int:
    count = cursor.u64(f"the number of {what}")
    if count > most:
        raise GGUFError(f"the header declares {count} {what}; at most {most} are read (a corrupt file?)")
    return count


def _read_metadata(cursor: _Cursor, count: int, limits: HeaderLimits) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for index in range(count):
        key = cursor.string(f"the key of metadata entry {index}", MAX_KEY_BYTES)
        value_type = cursor.u32(f"the type of metadata {key!r}")
        metadata[key] = _read_value(cursor, value_type, f"metadata {key!r}", limits)
    return metadata


def _read_value(cursor: _Cursor, value_type: int, what: str, limits: HeaderLimits) -> Any:
    if value_type in _SCALARS:
        value = cursor.scalar(*_SCALARS[value_type], what)
        return value if not isinstance(value, float) or math.isfinite(value) else str(value)
    if value_type == _STRING:
        return cursor.string(what, limits.string_bytes)
    if value_type != _ARRAY:
        raise GGUFError(f"{what} has value type {value_type}, which GGUF does not define")
    item_type = cursor.u32(f"the item type of {what}")
    length = cursor.u64(f"the length of {what}")
    if item_type in _SCALARS:
        if length > limits.array_items:
            raise GGUFError(f"{what} is an array of {length} items; at most {limits.array_items} are read")
        cursor.skip(length * _SCALARS[item_type][1], what)
    elif item_type == _STRING:
        if length > limits.string_items:
            raise GGUFError(f"{what} is an array of {length} strings; at most {limits.string_items} are read")
        for item in range(length):
            cursor.skip_string(f"{what}[{item}]", limits.string_bytes)
    elif item_type == _ARRAY:
        raise GGUFError(f"{what} is an array of arrays, which no model's metadata holds")
    else:
        raise GGUFError(f"{what} is an array of value type {item_type}, which GGUF does not define")
    return {"array": "string" if item_type == _STRING else _SCALARS[item_type][0][1:], "length": length}


def _read_tensor_info(cursor: _Cursor, index: int) -> tuple[str, str, tuple[int, ...], int, int]:
    """(name, type, shape in torch's order, offset in the data section, bytes) of the index-th tensor."""
    name = cursor.string(f"the name of tensor {index}", MAX_TENSOR_NAME_BYTES)
    where = f"tensor {name!r}"
    dimensions = cursor.u32(f"the dimension count of {where}")
    if not 1 <= dimensions <= MAX_DIMS:
        raise GGUFError(f"{where} has {dimensions} dimensions; a GGUF tensor has 1 to {MAX_DIMS}")
    dims = [cursor.u64(f"dimension {d} of {where}") for d in range(dimensions)]
    type_id = cursor.u32(f"the type of {where}")
    offset = cursor.u64(f"the data offset of {where}")
    if type_id not in GGML_TYPES:
        raise GGUFError(f"{where} has type {type_id}, which is not a ggml tensor type")
    type_name, block, block_bytes = GGML_TYPES[type_id]
    if any(d > MAX_ELEMENTS for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        raise GGUFError(f"{where} has the shape {dims}, far larger than any model's tensor")
    if dims[0] % block:
        raise GGUFError(f"{where} has rows of {dims[0]} values, which do not split into {type_name} blocks of {block}")
    return name, type_name, tuple(reversed(dims)), offset, math.prod(dims) // block * block_bytes


def _placed(
    entry: tuple[str, str, tuple[int, ...], int, int], data_start: int, alignment: int, size: int
) -> TensorInfo:
    name, type_name, shape, offset, nbytes = entry
    if offset % alignment:
        raise GGUFError(f"tensor {name!r}'s data offset {offset} is not a multiple of the alignment {alignment}")
    start = data_start + offset
    if start + nbytes > size:
        raise GGUFError(
            f"truncated: the data of tensor {name!r} ({type_name}, {nbytes} bytes from byte {start}) ends at byte "
            f"{start + nbytes}, past the end of the file ({size} bytes)"
        )
    return TensorInfo(name, type_name, shape, start, nbytes)


def _refuse_overlaps(tensors: tuple[TensorInfo, ...]) -> None:
    seen: set[str] = set()
    previous: TensorInfo | None = None
    for tensor in sorted(tensors, key=lambda t: (t.start, t.nbytes)):
        if tensor.name in seen:
            raise GGUFError(f"tensor {tensor.name!r} appears twice in the tensor table")
        seen.add(tensor.name)
        if previous is not None and tensor.start < previous.start + previous.nbytes:
            raise GGUFError(f"the data of tensors {previous.name!r} and {tensor.name!r} overlap")
        previous = tensor


def check_dequantizable(header: GGUFHeader) -> None:
    """Refuses the first tensor whose type transformers cannot turn back into floats, naming it."""
    for tensor in header.tensors:
        if tensor.type_name not in DEQUANTIZABLE:
            raise GGUFError(
                f"tensor {tensor.name!r} is stored as {tensor.type_name}, a type transformers cannot dequantize "
                f"(it dequantizes {', '.join(sorted(DEQUANTIZABLE))})"
            )


# --- converting --------------------------------------------------------------------------------------------------


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers loads as a causal language model, as llama.cpp names them."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    names = set(GGUF_SUPPORTED_ARCHITECTURES)
    with contextlib.suppress(ImportError):  # transformers' second GGUF path (5.x)
        from transformers.integrations.gguf import GGUF_ARCHS

        names |= set(GGUF_ARCHS)
    in_file = {theirs: ours for ours, theirs in _TRANSFORMERS_NAMES.items()}
    return sorted(in_file.get(name, name) for name in names - _NOT_CAUSAL_LMS)


def check_architecture(architecture: str) -> None:
    supported = supported_architectures()
    if architecture not in supported:
        raise GGUFError(
            f"architecture {architecture!r} (general.architecture) is not one transformers can dequantize; "
            f"it dequantizes: {', '.join(supported)}"
        )


def convert(source: Path, output: Path, dtype: str = "float32", *, max_shard_mb: int = 4096) -> GGUFHeader:
    """Writes the model folder `output` (which must not exist) from the GGUF `source`: safetensors in `dtype`,
    config, generation config, tokenizer with its chat template. The folder is written beside it under a
    hidden name and renamed into place once whole; nothing of it remains when this fails."""
    if dtype not in DTYPES:
        raise GGUFError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    if output.exists():
        raise GGUFError(f"{output} exists already")
    header = read_header(source)
    check_dequantizable(header)
    check_architecture(header.architecture)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch_dtype)
    model = _plain_model(loaded, torch_dtype)
    del loaded
    partial = output.with_name(f".{output.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model.save_pretrained(partial, max_shard_size=f"{max_shard_mb}MB")
        tokenizer.save_pretrained(partial)
        partial.rename(output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return header


def _plain_model(loaded: Any, torch_dtype: Any) -> Any:
    """The loaded model as an ordinary one: its config without the GGUF quantization (save_pretrained refuses a
    GGUF-quantized model), its dequantized weights moved over as they are (no copy, no initialisation)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""  # the sandbox's path to the file means nothing outside it
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    model.tie_weights()
    if loaded.generation_config is not None:
        model.generation_config = copy.deepcopy(loaded.generation_config)
    return model.eval()


# --- checking the result -----------------------------------------------------------------------------------------


def _chat_prompt(tokenizer: Any, prompt: str) -> Any:
    """The prompt as the model's chat template frames a user's turn (the plain text for a model without one)."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


def answer(folder: Path, prompt: str, max_new_tokens: int = 8) -> dict[str, Any]:
    """The folder loaded with transformers, answering `prompt` greedily: {"text", "tokens", "seconds"}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto").eval()
    input_ids = _chat_prompt(tokenizer, prompt)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    new = output[0, input_ids.shape[1] :]
    if not len(new):
        raise GGUFError("the converted model generated no token for the check prompt")
    text = tokenizer.decode(new, skip_special_tokens=True)
    return {"text": text[:500], "tokens": len(new), "seconds": round(time.monotonic() - started, 1)}


def answer_vllm(folder: Path, prompt: str, max_new_tokens: int = 8, dtype: str = "auto") -> dict[str, Any]:
    """The folder loaded with vLLM in `dtype` (on the CPU: the sandbox sees no GPU), answering `prompt` greedily."""
    started = time.monotonic()
    threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cpus)))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: the engine core in this one
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        dtype=dtype,
        max_model_len=512,
        kv_cache_memory_bytes=256 << 20,
        enforce_eager=True,
        seed=0,
    )
    outputs = llm.chat(
        [{"role": "user", "content": prompt}],
        SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
        use_tqdm=False,
    )
    completion = outputs[0].outputs[0]
    if not completion.token_ids:
        raise GGUFError("vLLM generated no token for the check prompt with the converted model")
    return {
        "text": completion.text[:500],
        "tokens": len(completion.token_ids),
        "seconds": round(time.monotonic() - started, 1),
    }


# --- the command line ----------------------------------------------------------------------------------------------


def _convert_and_check(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    source, output = Path(args.source), Path(args.output)
    header = convert(source, output, args.dtype, max_shard_mb=args.max_shard_mb)
    converted_s = time.monotonic() - started
    import gc

    gc.collect()  # the converted weights, before the folder is loaded again
    report: dict[str, Any] = {
        "header": header.summary(),
        "dtype": args.dtype,
        "convert_seconds": round(converted_s, 1),
        "versions": _versions(),
        "check": None,
        "vllm": None,
    }
    try:
        if args.check_prompt:
            report["check"] = {"prompt": args.check_prompt, **answer(output, args.check_prompt, args.check_tokens)}
        if args.vllm:
            report["vllm"] = _vllm_check(output, args.check_prompt or "Hello", args.check_tokens, args.dtype)
    except BaseException:
        shutil.rmtree(output, ignore_errors=True)  # a folder that does not answer is not a model
        raise
    return report


def _vllm_check(folder: Path, prompt: str, max_new_tokens: int, dtype: str) -> dict[str, Any]:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed here"}
    return {"prompt": prompt, **answer_vllm(folder, prompt, max_new_tokens, dtype)}


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in ("transformers", "gguf", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def _report(fd: int | None, report: dict[str, Any]) -> None:
    line = json.dumps(report) + "\n"
    if fd is None:
        sys.stdout.write(line)
        return
    with os.fdopen(fd, "w") as out:
        out.write(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_engine.models.gguf", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    header = commands.add_parser("header", help="the file's header as JSON (checked)")
    header.add_argument("source")
    convert_cmd = commands.add_parser("convert", help="convert to a Hugging Face model folder")
    convert_cmd.add_argument("source")
    convert_cmd.add_argument("output", help="the folder to write (must not exist)")
    convert_cmd.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="auto: this machine's")
    convert_cmd.add_argument("--check-prompt", default="", help="answer it with the result (transformers)")
    convert_cmd.add_argument("--check-tokens", type=int, default=8)
    convert_cmd.add_argument("--vllm", action="store_true", help="answer the check prompt with vLLM too")
    convert_cmd.add_argument("--max-shard-mb", type=int, default=4096)
    convert_cmd.add_argument("--report-fd", type=int, default=None, help="write the JSON report there")
    args = parser.parse_args(argv)
    fd = getattr(args, "report_fd", None)
    try:
        if args.command == "header":
            _report(None, read_header(args.source).summary())
            return 0
        if args.dtype == "auto":  # never in the sandbox, where this file runs alone with a dtype given
            from rl_engine.host_dtype import training_dtype

            args.dtype = training_dtype()
        _report(fd, {"ok": True, **_convert_and_check(args)})
        return 0
    except GGUFError as exc:
        _report(fd, {"ok": False, "error": str(exc)})
        return 2
    except Exception as exc:
        if _out_of_memory(exc):
            _report(fd, {"ok": False, "error": "ran out of memory converting the model"})
            return 1
        _report(fd, {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return 1


# How the sandbox's address-space cap shows when a shared library (torch's) cannot be mapped, besides MemoryError.
_NO_MEMORY_MESSAGES = ("failed to map segment", "cannot allocate memory")


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or (
        isinstance(exc, (ImportError, OSError)) and any(m in str(exc).lower() for m in _NO_MEMORY_MESSAGES)
    )


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
