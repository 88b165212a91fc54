"""Dispatch oracle: which PyTorch SDPA backend a call really takes, and what a fallback costs.

Two independent measurements per configuration:
- ``chosen``: ``torch._fused_sdp_choice`` (the selector the default call runs);
- ``accepted``: each backend forced alone with ``sdpa_kernel([b])``; a refusal is PyTorch's
  "No available kernel".
``chosen`` must be one of ``accepted`` (else the measurement itself is broken).

``python -m attention_oracle.tools.dispatch`` prints the table for the installed torch (and, on a GPU,
the time of the rank-3 call over the same data as rank 4).
"""
from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_oracle.judge.adapters.torch_sdpa import refused

NAMES = {int(SDPBackend.MATH): "MATH", int(SDPBackend.FLASH_ATTENTION): "FLASH_ATTENTION",
         int(SDPBackend.EFFICIENT_ATTENTION): "EFFICIENT_ATTENTION",
         int(SDPBackend.CUDNN_ATTENTION): "CUDNN_ATTENTION", int(SDPBackend.ERROR): "ERROR"}
FORCEABLE = (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
             SDPBackend.CUDNN_ATTENTION)


@dataclass
class Config:
    rank: int
    heads: int
    length: int
    head_dim: int
    dtype: str
    causal: bool = False
    mask: bool = False
    device: str = "cpu"

    def tensors(self, seed: int = 0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        dt = getattr(torch, self.dtype)
        shape = (self.heads, self.length, self.head_dim)
        if self.rank == 4:
            shape = (1,) + shape
        q, k, v = (torch.randn(shape, generator=g).to(self.device, dt) for _ in range(3))
        mask = None
        if self.mask:
            mask = torch.ones(self.length, self.length, dtype=torch.bool, device=self.device).tril()
        return q, k, v, mask


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def claims_rank3_fusion() -> bool:
    """PyTorch announces fused backends for rank-3 inputs from 2.14 (PR #192271, FACTS.md)."""
    return torch_version() >= (2, 14)


def rank3_verdict(chosen3: str, chosen4: str, claims_fusion: bool) -> str:
    """"ok" unless rank 3 falls back to MATH where rank 4 is fused: then "expected" on a torch
    that does not claim rank-3 fusion, "fail" on one that does."""
    if not (chosen3 == "MATH" and chosen4 != "MATH"):
        return "ok"
    return "fail" if claims_fusion else "expected"


def chosen_backend(cfg: Config) -> str:
    q, k, v, mask = cfg.tensors()
    choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, cfg.causal and mask is None)
    return NAMES.get(int(choice), str(choice))


def accepted_backends(cfg: Config) -> list[str]:
    q, k, v, mask = cfg.tensors()
    ok = []
    for backend in FORCEABLE:
        try:
            with sdpa_kernel([backend]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=cfg.causal and mask is None)
            ok.append(NAMES[int(backend)])
        except RuntimeError as exc:
            if not refused(exc):
                raise
    return ok


def time_call(cfg: Config, repeats: int = 5) -> float:
    """Median seconds of one default-dispatch forward call."""
    q, k, v, mask = cfg.tensors()
    causal = cfg.causal and mask is None

    def call():
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    if cfg.device.startswith("cuda"):
        from triton.testing import do_bench
        return do_bench(call, warmup=25, rep=100, return_mode="median") / 1e3
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def rank3_slowdown(cfg3: Config) -> float:
    """Time of the rank-3 call over the same data as rank 4."""
    cfg4 = Config(**{**asdict(cfg3), "rank": 4})
    return time_call(cfg3) / time_call(cfg4)


def default_configs(device: str) -> list[Config]:
    if device.startswith("cuda"):
        dtypes, length, heads = ("bfloat16", "float16", "float32"), 4096, 32
    else:
        dtypes, length, heads = ("float32", "bfloat16"), 1024, 16
    out = []
    for dtype in dtypes:
        for head_dim in (64, 128):
            for causal, mask in ((False, False), (True, False), (False, True)):
                for rank in (3, 4):
                    out.append(Config(rank, heads, length, head_dim, dtype, causal, mask, device))
    return out


def table(device: str, timing: bool = True) -> list[dict]:
    rows = []
    for cfg in default_configs(device):
        row = {**asdict(cfg), "chosen": chosen_backend(cfg), "accepted": accepted_backends(cfg)}
        if timing and cfg.rank == 3:
            row["rank3_over_rank4_time"] = rank3_slowdown(cfg)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="attention-oracle dispatch", description="Which PyTorch SDPA backend each call takes, rank 3 against rank 4, measured on this machine.")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--json", help="also write the rows as JSON here")
    a = p.parse_args(argv)
    rows = table(a.device, timing=not a.no_timing)
    print(f"torch {torch.__version__} on {a.device}; claims rank-3 fusion: {claims_rank3_fusion()}")
    print(f"{'rank':>4} {'dtype':>9} {'D':>4} {'L':>5} {'causal':>6} {'mask':>5} {'chosen':>20}  "
          f"{'rank3/rank4 time':>16}  accepted")
    for r in rows:
        t = f"{r['rank3_over_rank4_time']:.1f}x" if "rank3_over_rank4_time" in r else ""
        print(f"{r['rank']:>4} {r['dtype']:>9} {r['head_dim']:>4} {r['length']:>5} {str(r['causal']):>6} "
              f"{str(r['mask']):>5} {r['chosen']:>20}  {t:>16}  {','.join(r['accepted'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
