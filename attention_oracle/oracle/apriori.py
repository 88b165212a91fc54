"""The agreement rule's a-priori term (docs/agreement-rule.md, "The a-priori term"), shared by
the SDPA and DSA references (DSA applies it to each token's gathered slots).
"""
import torch

# The relative error of each P_ij that the exponent's argument carries in the standard fused
# algorithms, in units of the accumulation dtype's unit roundoff u, propagated to first order
# through out, lse and the gradients. A fused kernel rounds the score when it scales it and again when it takes it to
# log2 units (2|s|), the row max or lse it subtracts likewise (2|m|, 2|lse|), a 3xTF32 score
# carries about 2u per unit of sum|q_e k_e| scale (the split's dropped and rounded parts; 1.6-2.6u
# measured on the H200 beyond the two roundings), and exp2 on the GPU is approximate (4u). Rows whose max is so large that u |m| is no longer small
# are left to the ensemble (the argument overflows there: kernels that get those rows right
# subtract first).
APRIORI_SCORE, APRIORI_SHIFT, APRIORI_DOT, APRIORI_EXP2 = 2.0, 2.0, 2.0, 4.0
APRIORI_MAX_SHIFT = 2.0 ** 20   # |m| beyond this: u |m| >= 2^-4 in float32


def rho(s, dotabs, shift):
    """rho_ij / u = 2|s_ij| + 2|shift_i| + 2 dotabs_ij + 4, 0 where s is -inf and on rows whose
    |shift| passes APRIORI_MAX_SHIFT; ``shift`` [.., rows, 1] (row max or lse)."""
    finite = torch.isfinite(s)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift)).abs()
    r = (APRIORI_SCORE * torch.where(finite, s, torch.zeros_like(s)).abs()
         + APRIORI_SHIFT * shift + APRIORI_DOT * dotabs + APRIORI_EXP2)
    keep = finite & (shift <= APRIORI_MAX_SHIFT)
    return torch.where(keep, r, torch.zeros_like(r))


def spread(w, v, out):
    """sum_j w_ij |v_j - out_i| per element [.., rows, Ev], bounded by Cauchy-Schwarz:
    sqrt(sum_j w_ij (v_j - out_i)^2 * sum_j w_ij) with the square expanded into matmuls."""
    wsum = w.sum(-1, keepdim=True)
    second = torch.matmul(w, v * v) - 2 * out * torch.matmul(w, v) + out * out * wsum
    return torch.sqrt(second.clamp_min(0) * wsum)


def bound_mm(a, b):
    """a @ b for the non-negative terms of a bound, in float32 (a bound needs no more digits,
    and no term cancels), back in a's dtype."""
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def apriori_bounds(qc, k_abs, v, s, p, lse_c, oc, sc, doc=None, dp=None, delta=None):
    """The a-priori bounds of one query chunk, in units of u, for queries qc [.., L, E] against
    keys |k| ``k_abs`` [.., S, E] and values v [.., S, Ev] (batch dims alike): {"out" [.., L, Ev],
    "lse" [.., L]} from the scaled scores s and probabilities p [.., L, S], lse_c [.., L], the
    output oc and the scale sc; with ``doc`` (dO), ``dp`` (dO V^T) and ``delta`` ([.., L, 1])
    also "dq" [.., L, E] and the chunk's "dk" [.., S, E] and "dv" [.., S, Ev] terms."""
    q_abs = qc.abs()
    dotabs = bound_mm(q_abs, k_abs.transpose(-1, -2)) * abs(sc)
    m = s.amax(-1, keepdim=True)   # -inf on a row no key takes part in
    w = p * rho(s, dotabs, m)
    lse = lse_c.unsqueeze(-1)
    b = {"out": spread(w, v, oc)}
    kept = torch.isfinite(lse) & (lse.abs() <= APRIORI_MAX_SHIFT)
    lse_err = w.sum(-1, keepdim=True) + APRIORI_SHIFT * torch.where(kept, lse, torch.zeros_like(lse)).abs()
    b["lse"] = lse_err.squeeze(-1)
    if doc is None:
        return b
    wb = p * (rho(s, dotabs, lse) + lse_err)   # P recomputed from the stored lse
    delta_err = (doc.abs() * b["out"]).sum(-1, keepdim=True)
    ds = wb * (dp - delta).abs() + p * delta_err
    b["dq"] = bound_mm(ds, k_abs) * abs(sc)
    b["dk"] = bound_mm(ds.transpose(-1, -2), q_abs) * abs(sc)
    b["dv"] = bound_mm(wb.transpose(-1, -2), doc.abs())
    return b
