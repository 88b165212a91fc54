"""benchmarks/dsa_l2_model.py: its orders are fast's, and its cache counts what it should."""
import numpy as np
import torch

import attention_oracle.fast.dsa as fdsa
from benchmarks import dsa_l2_model as model


def test_model_runs_order_is_the_kernels(monkeypatch):
    """The model's "runs" order is what fast.dsa.slot_order(form="runs") writes on compacted
    rows (256 slots: four samples of 64), and its "network" order fast's sorted one."""
    monkeypatch.setattr(fdsa, "ORDER_CONCURRENCY", 5)
    rng = np.random.default_rng(1)
    K, S, T = 256, 3000, 11
    rows = [rng.choice(S, size=int(n), replace=False) for n in rng.integers(1, K + 1, T)]
    padded = torch.full((T, K), -1, dtype=torch.int32)
    for t, keys in enumerate(rows):
        padded[t, :len(keys)] = torch.from_numpy(keys)
    lengths = torch.tensor([len(k) for k in rows], dtype=torch.int32)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for form, want in (("runs", model.runs(rows, 5, 64, k=K)), ("network", model.network(rows, 5))):
        got, n = fdsa.slot_order(padded.to(dev), lengths.to(dev), S, form=form)
        assert torch.equal(n.cpu(), lengths), form
        for t in range(T):
            assert np.array_equal(got[t, :len(rows[t])].cpu().numpy(), want[t]), (form, t)


def test_hit_rate_counts_reuse():
    """Two programs on the same keys: every gather after the first of a key hits; a cache too
    small for one block misses every time."""
    rows = [np.arange(128), np.arange(128)]
    assert model.hit_rate(rows, concurrency=2, capacity=1000) == 0.5
    assert model.hit_rate([np.arange(256)], concurrency=1, capacity=10) == 0.0
