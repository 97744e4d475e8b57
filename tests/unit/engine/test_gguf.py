"""A GGUF turned into a model folder (rl_engine/models/gguf.py) and the same in the sandbox (sandboxed.py): the header
read with bounded reads, each refusal naming what and where, tiny Llama and Qwen2 files (quantized Q8_0) converted
into folders transformers loads and that answer a prompt through their chat template."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rl_engine import sandbox
from rl_engine.models import gguf as converter
from rl_engine.models import sandboxed
from rl_engine.models.gguf import GGUFError, HeaderLimits, read_header
from tests.support.gguf_files import write_tiny_gguf

needs_sandbox = pytest.mark.skipif(not sandbox.status().available, reason=f"no sandbox: {sandbox.status().detail}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    return {arch: write_tiny_gguf(folder / f"tiny-{arch}.gguf", arch) for arch in ("llama", "qwen2")}


def copy_of(source: Path, target: Path, size: int | None = None, patch: tuple[int, bytes] | None = None) -> Path:
    data = bytearray(source.read_bytes()[:size])
    if patch:
        offset, replacement = patch
        data[offset : offset + len(replacement)] = replacement
    target.write_bytes(bytes(data))
    return target


# --- the header --------------------------------------------------------------------------------------------------


def test_the_header_says_what_the_file_holds(tiny):
    header = read_header(tiny["llama"])
    assert header.version == 3 and header.architecture == "llama" and header.model_name == "tiny-llama"
    assert header.quantization == {"Q8_0": 15, "F32": 5}  # the matrices, and the norms
    assert header.parameter_count == 26_976
    assert header.tensors[-1].start + header.tensors[-1].nbytes <= header.file_size
    summary = header.summary()
    assert summary["tokenizer"] == "gpt2" and summary["context_length"] == 128
    assert json.loads(json.dumps(summary)) == summary


def test_the_type_table_is_ggmls_and_every_dequantizable_type_dequantizes():
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    ours = {type_id: (block, size) for type_id, (_, block, size) in converter.GGML_TYPES.items()}
    theirs = {int(t): sizes for t, sizes in gguf.constants.GGML_QUANT_SIZES.items()}
    assert ours == theirs
    assert {name for name, _, _ in converter.GGML_TYPES.values()} == {t.name for t in gguf.GGMLQuantizationType}
    for type_id, (name, _, size) in converter.GGML_TYPES.items():
        if name in converter.DEQUANTIZABLE:
            dequantize(np.zeros(size * 2, dtype=np.uint8), gguf.GGMLQuantizationType(type_id))


@pytest.mark.parametrize(
    ("mangle", "says"),
    [
        (lambda f, t: t.write_bytes(b"PK\x03\x04" + f.read_bytes()[4:]), "not a GGUF file: it starts with 50 4b 03 04"),
        (lambda f, t: copy_of(f, t, size=6), "truncated: the file ends at byte 6, before the GGUF version"),
        (lambda f, t: copy_of(f, t, patch=(4, struct.pack("<I", 1))), "GGUF version 1"),
        (lambda f, t: copy_of(f, t, patch=(4, struct.pack(">I", 3))), "a big-endian GGUF"),
        (lambda f, t: copy_of(f, t, size=2000), "truncated: the length of metadata 'tokenizer.ggml.tokens'[148]"),
        (lambda f, t: copy_of(f, t, patch=(8, struct.pack("<Q", 1 << 40))), "declares 1099511627776 tensors"),
        (lambda f, t: copy_of(f, t, patch=(16, struct.pack("<Q", 1 << 40))), "1099511627776 metadata entries"),
        (lambda f, t: copy_of(f, t, patch=(24, struct.pack("<Q", 1 << 62))), "the key of metadata entry 0"),
    ],
    ids=["magic", "short", "version", "big-endian", "cut-in-metadata", "tensors", "metadata", "key-length"],
)
def test_a_damaged_header_is_refused_saying_what_and_where(tiny, tmp_path, mangle, says):
    damaged = tmp_path / "damaged.gguf"
    mangle(tiny["llama"], damaged)
    with pytest.raises(GGUFError, match=None) as refused:
        read_header(damaged)
    assert says in str(refused.value)


def test_tensor_data_past_the_end_of_the_file_is_refused_naming_the_tensor(tiny, tmp_path):
    header = read_header(tiny["llama"])
    last = max(header.tensors, key=lambda t: t.start)
    cut = copy_of(tiny["llama"], tmp_path / "cut.gguf", size=last.start + 10)
    with pytest.raises(GGUFError, match=rf"truncated: the data of tensor '{last.name}' \(F32, 128 bytes"):
        read_header(cut)


def test_a_header_larger_than_its_bound_is_refused_before_it_is_read(tiny):
    with pytest.raises(GGUFError, match="lies past the first 0 MiB of the file, where the header must have ended"):
        read_header(tiny["llama"], HeaderLimits(header_bytes=4096))
    with pytest.raises(GGUFError, match=r"metadata 'tokenizer.ggml.tokens' is an array of 262 strings; at most 10"):
        read_header(tiny["llama"], HeaderLimits(string_items=10))


def test_a_tensor_type_transformers_cannot_dequantize_is_refused_naming_the_tensor(tmp_path):
    odd = write_tiny_gguf(tmp_path / "odd.gguf", odd_tensor=("blk.1.ffn_up.weight", "I8"))
    header = read_header(odd)
    assert header.quantization["I8"] == 1
    with pytest.raises(GGUFError, match="tensor 'blk.1.ffn_up.weight' is stored as I8, a type transformers cannot"):
        converter.check_dequantizable(header)


def test_an_architecture_transformers_cannot_dequantize_is_named_with_those_it_can(tmp_path):
    supported = converter.supported_architectures()
    assert {"llama", "qwen2", "mistral", "qwen2moe", "gemma3"} <= set(supported)
    assert not {"t5", "general", "tokenizer"} & set(supported)
    with pytest.raises(GGUFError, match=r"architecture 'rwkv7' \(general.architecture\) is not one transformers") as no:
        converter.check_architecture("rwkv7")
    assert "llama, " in str(no.value) and "qwen2" in str(no.value)


# --- converting ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_tiny_gguf_becomes_a_model_folder_transformers_loads_and_that_answers(tiny, tmp_path, arch):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "model"
    header = converter.convert(tiny[arch], out, "float32")
    assert header.architecture == arch
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = AutoConfig.from_pretrained(out)
    assert config.model_type == arch and not hasattr(config, "quantization_config")
    with safe_open(out / "model.safetensors", "pt") as weights:
        assert {str(weights.get_tensor(name).dtype) for name in weights.keys()} == {"torch.float32"}  # noqa: SIM118
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "the"}], add_generation_prompt=True, tokenize=False
    )
    answer = converter.answer(out, "the the", max_new_tokens=3)
    assert answer["tokens"] == 3


def test_a_conversion_that_fails_leaves_no_folder(tiny, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    from transformers import PreTrainedTokenizerBase

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        converter.convert(tiny["llama"], tmp_path / "model", "bfloat16")
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_reports_a_refusal_as_json_with_exit_code_2(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"\x00" * 64)
    done = subprocess.run(
        [sys.executable, "-m", "rl_engine.models.gguf", "convert", str(not_gguf), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert json.loads(done.stdout) == {
        "ok": False,
        "error": "not a GGUF file: it starts with 00 00 00 00, not the magic bytes 47 47 55 46 ('GGUF')",
    }


# --- in the sandbox ------------------------------------------------------------------------------------------------


def staging(tmp_path: Path, source: Path) -> tuple[Path, Path]:
    folder = tmp_path / "staging"
    folder.mkdir(mode=0o700)
    (folder / "out").mkdir()
    return copy_of(source, folder / "source.gguf"), folder / "out"


@needs_sandbox
def test_in_the_sandbox_the_converter_writes_only_a_model_folder_of_plain_files(tiny, tmp_path):
    source, out = staging(tmp_path, tiny["qwen2"])
    report = sandboxed.convert_gguf(source, out, sandboxed.ConvertOptions(memory_mb=4096, cpus=1))
    assert report["ok"] and report["header"]["architecture"] == "qwen2" and report["dtype"] == "float32"
    assert report["check"]["tokens"] == 8 and report["vllm"] is None
    assert report["versions"]["gguf"] == "0.19.0"
    model = out / "model"
    assert [p.name for p in out.iterdir()] == ["model"]
    for path in (out, model, *model.iterdir()):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (os.getuid(), os.getgid())
    assert (model / "config.json").stat().st_mode & 0o777 == 0o644


@needs_sandbox
def test_a_conversion_past_its_deadline_or_its_memory_is_stopped_and_leaves_nothing(tiny, tmp_path):
    source, out = staging(tmp_path, tiny["llama"])
    with pytest.raises(GGUFError, match="the conversion did not finish within 0.5 s"):
        sandboxed.convert_gguf(source, out, sandboxed.ConvertOptions(timeout_s=0.5))
    assert list(out.iterdir()) == []
    with pytest.raises(GGUFError, match="memory"):  # torch cannot even load in 200 MiB
        sandboxed.convert_gguf(source, out, sandboxed.ConvertOptions(memory_mb=200))
    assert list(out.iterdir()) == []


def test_a_refusal_of_the_header_comes_before_any_sandbox(tmp_path, monkeypatch):
    def no_sandbox(*args, **kwargs):
        raise AssertionError("a sandbox was started")

    monkeypatch.setattr(sandboxed, "run_reporting", no_sandbox)
    odd = write_tiny_gguf(tmp_path / "odd.gguf", odd_tensor=("token_embd.weight", "I8"))
    with pytest.raises(GGUFError, match="tensor 'token_embd.weight' is stored as I8"):
        sandboxed.convert_gguf(odd, tmp_path, sandboxed.ConvertOptions())


@pytest.mark.parametrize("made", ["link", "subfolder", "hidden", "two"])
def test_what_the_sandbox_wrote_is_refused_unless_plain_files_in_one_folder(tmp_path, made):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    if made == "link":
        (model / "tokenizer.json").symlink_to("/etc/passwd")
    elif made == "subfolder":
        (model / "nested").mkdir()
    elif made == "hidden":
        (model / ".cache").write_text("")
    else:
        (tmp_path / "elsewhere").mkdir()
    with pytest.raises(GGUFError, match="the converter (wrote|left)"):
        sandboxed._accept(tmp_path, 1 << 20)


def test_the_output_bound_is_the_model_in_the_target_dtype(tiny):
    header = read_header(tiny["llama"])
    assert sandboxed.output_bytes(header, "float32") - sandboxed.output_bytes(header, "bfloat16") == 2 * 26_976
