"""A Case: plain data that rebuilds an example exactly (shapes, flags, layouts, seed).

Cases print as one line of JSON, can be saved in the regression corpus
(``fixtures/regressions/*.json``) and replayed with ``attention-oracle replay``
(``checks.catalogue.load_case`` rebuilds one of any area).
"""
from __future__ import annotations

import dataclasses
import json

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class CaseMixin:
    """JSON round trip and reproduction text for frozen dataclasses."""

    AREA = ""

    def to_json(self) -> str:
        return json.dumps({"area": self.AREA, **dataclasses.asdict(self)}, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for k, v in d.items():
            if k not in fields:
                continue
            kwargs[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kwargs)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def repro(self, check: str, impl: str) -> str:
        return f"python -m attention_oracle replay --impl {impl} --check {check} '{self.to_json()}'"
