"""Minimal reproduction: SDPA rows whose every key carries torch.finfo(dtype).min (Hugging Face
padding) on each PyTorch backend, rank 3 and rank 4. PyTorch's semantics (and the contract): such
a row is not masked, its output is that row's softmax over the keys (uniform here: the bias
absorbs the scores), not 0. Prints the max deviation from the float64 softmax per backend.

    python -m benchmarks.finfo_min_rows
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def case(dtype, device, rank, S=4, E=8, L=2):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, E, generator=g) for n in (L, S, S))
    mask = torch.zeros(1, 1, L, S)
    mask[..., 0, :] = torch.finfo(dtype).min          # row 0: every key at finfo.min
    s = (q.double() @ k.double().transpose(-1, -2)) / E ** 0.5 + mask.double()
    gold = torch.softmax(s, -1) @ v.double()
    args = [t.to(device, dtype) for t in (q, k, v, mask)]
    if rank == 3:
        args = [t[0] for t in args]
        gold = gold[0]
    return args, gold


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    for dtype, rank, S in [(d, r, s) for d in (torch.float32, torch.float16, torch.bfloat16)
                           for r in (4, 3) for s in (1, 4, 130)]:
            for name, be in [("default", None)] + list(BACKENDS.items()):
                (q, k, v, m), gold = case(dtype, device, rank, S=S)
                try:
                    if be is None:
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                    else:
                        with sdpa_kernel([be]):
                            out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                except RuntimeError as exc:
                    print(f"{str(dtype):15s} rank {rank} S {S:3d} {name:9s} refused: {str(exc).splitlines()[0][:60]}")
                    continue
                o = out.double().cpu()
                row0 = (o[..., 0, :] - gold[..., 0, :]).abs().max().item()
                row1 = (o[..., 1, :] - gold[..., 1, :]).abs().max().item()
                print(f"{str(dtype):15s} rank {rank} S {S:3d} {name:9s} finfo.min row: max|out-gold| {row0:.3e}"
                  f" (out {[round(x, 4) for x in o[..., 0, :3].flatten().tolist()]}, gold "
                  f"{[round(x, 4) for x in gold[..., 0, :3].flatten().tolist()]}); other row {row1:.3e}")


if __name__ == "__main__":
    main()
