"""The base every config section shares (unknown keys refused, no inf/nan) and the dtype choices."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Dtype = Literal["float32", "bfloat16", "float16"]
PolicyDtype = Literal["auto", "float32", "bfloat16", "float16"]


class _Section(BaseModel):
    # Note for descriptions: pydantic leaves a section field's description out of the JSON schema
    # when it equals the section class's docstring, so keep the two worded differently (a test
    # checks that every property carries a description).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
