"""The Tinker SDK's wire forms, read and written with the SDK's own published protobuf schema.

``forward_backward`` arrives as ``application/x-protobuf`` (``tinker_public_pb2.ForwardBackwardRequest``),
and the SDK accepts a ``ForwardBackwardOutput`` or a ``SampleResponse`` only as protobuf; every other body
is JSON validated by the SDK's pydantic types. Decoding is bounded by the request body's size, which the
server caps before it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tinker.proto import tinker_public_pb2 as pb

from rl_engine.tinker.losses import LossRefused
from rl_engine.tinker.model import Datum, ForwardResult, SampledText

__all__ = ["FwdBwdCall", "decode_forward_backward", "encode_forward_backward_output", "encode_sample_response"]

_NUMPY_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass(frozen=True)
class FwdBwdCall:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def decode_forward_backward(body: bytes) -> FwdBwdCall:
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # the protobuf runtime's DecodeError; any failure is the body's
        raise LossRefused(f"forward_backward: the body is not a ForwardBackwardRequest ({exc})") from exc
    config: dict[str, float | str] = {k: float(v) for k, v in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = [_datum(i, d) for i, d in enumerate(message.data)]
    return FwdBwdCall(message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, data)


def _datum(index: int, message: pb.Datum) -> Datum:
    tokens: list[int] = []
    for chunk in message.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise LossRefused(f"data[{index}].model_input: only token chunks are served (no images or audio)")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    inputs = {name: _tensor(f"data[{index}].loss_fn_inputs[{name!r}]", t) for name, t in message.loss_fn_inputs.items()}
    return Datum(tokens=tokens, inputs=inputs)


def _tensor(where: str, message: pb.Tensor) -> torch.Tensor:
    dtype = _NUMPY_DTYPES.get(message.dtype)
    if dtype is None:
        raise LossRefused(f"{where}: dtype {message.dtype} is not served (float32 or int64)")
    if message.HasField("sparse_csr"):
        return _sparse(where, message, dtype)
    values: np.ndarray = np.frombuffer(message.dense, dtype=dtype)
    return torch.from_numpy(values.copy())


def _sparse(where: str, message: pb.Tensor, dtype: type) -> torch.Tensor:
    """A one-row sparse CSR tensor made dense (shape ``[N]`` or ``[1, N]``): the column indices place every value."""
    shape = list(message.shape)
    col = np.frombuffer(message.sparse_csr.col_indices, dtype=np.int64)
    values: np.ndarray = np.frombuffer(message.sparse_csr.values, dtype=dtype)
    one_row = len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)
    if not one_row or len(col) != len(values) or (len(col) and (col.min() < 0 or col.max() >= shape[-1])):
        raise LossRefused(f"{where}: a sparse tensor whose indices do not fit its shape {shape}")
    dense = np.zeros(shape[-1], dtype=dtype)
    dense[col] = values
    return torch.from_numpy(dense)


def encode_forward_backward_output(result: ForwardResult, metrics: dict[str, float]) -> bytes:
    """One batched ``logprobs`` field, a float32 run per datum, as the SDK's reader slices it."""
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        message.metrics[key] = float(value)
    record = message.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(result.logprobs))
    arrays = [np.asarray(lp, dtype=np.float32) for lp in result.logprobs]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
    field = record.fields["logprobs"]
    field.dtype = pb.DTYPE_FLOAT32
    field.data = b"".join(a.tobytes() for a in arrays)
    field.offsets = offsets.tobytes()
    return message.SerializeToString()


def encode_sample_response(samples: list[SampledText], prompt_logprobs: list[float | None] | None) -> bytes:
    message = pb.SampleResponse()
    for sample in samples:
        sequence = message.sequences.add()
        sequence.stop_reason = pb.STOP_REASON_STOP if sample.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        sequence.tokens = np.asarray(sample.tokens, dtype=np.int32).tobytes()
        sequence.logprobs = np.asarray(sample.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in prompt_logprobs]
        message.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return message.SerializeToString()
