"""Does the order of a row's slots change how fast the DSA kernels gather?

    python -m benchmarks.dsa_order [--problems packed_glm_a,doc_16384] [--reps 5]
        [--concurrency 132,264] [--backward] [--only given,fast_backward]
        [--warps 1,2,4] [--forms loop] [--step-forms loop:loop,runs:loop --rounds 3] [--out FILE]

The kernels walk a row's slots in the order given. ``benchmarks.dsa``'s rows come from
``torch.topk`` over random scores: random order, so the programs on the GPU at one time gather
rows from anywhere in their documents, and a document's rows larger than the L2 miss it
(packed_glm_a: 57-68k keys, 65-78 MB of rows). Each ordering below holds the same slots per
row (the valid ones first, as the compacted rows have them; only their order changes):

* ``given``: as ``benchmarks.dsa`` makes them;
* ``ascending``: each row's valid slots sorted by key;
* ``rotated_N``: sorted, then rotated left by ``(t mod N) / N`` of the row's valid slots
  (token t): if programs start one after another, N at a time, the programs on the GPU at
  one time then walk the same part of the keys together (N: the programs resident at once);
* ``pivoted_N``: fast's own order (:func:`fast.dsa.slot_order` with ``N`` programs resident),
  made before the call: sorted, from the key at ``(t mod N) / N`` of the row's key range;
* ``descending``: sorted by key, largest first.

These run with fast's own slot order off (``fast.dsa.set_slot_order("off")``); then the given
rows run under each of fast's settings (``fast_backward``: the backward orders its rows,
``fast_on``: the forward too, :func:`fast.dsa.slot_order`), the ordering's launch timed
beside (``--warps 1,2,...``: also launched with those warps a row; ``--forms loop,...``: also
in those forms of the kernel, ``fast.dsa.ORDER_FORMS``; each checked to give the default
launch's rows, "runs" (another order) the same keys a row; ``--only none`` times the ordering
alone). The settings' ordering runs in the process's forms
(``ATTENTION_ORACLE_FAST_DSA_ORDER_FORM=runs`` and ``..._BACKWARD_ORDER_FORM``), or in turn
under each forward:backward pair of ``--step-forms``, ``--rounds`` times (alternated rounds).

Per problem and ordering: the forward (no grad) and, with ``--backward``, the backward of the
defaults, timed queued (do_bench) and synced, TFLOP/s over valid slots, and the largest
difference of out (and of dq) from the ``given`` order's (the sums run in another order: a
rounding difference, not a wrong result).
"""
import argparse
import json

import torch

import attention_oracle.fast.dsa as fdsa

from .dsa import BWD_FLOP, FWD_FLOP, fast_forward, leaves, named_problem, tflops
from .timing import fast_settings, queued_ms, synced_ms

_BIG = torch.iinfo(torch.int32).max


def ascending(rows, lengths):
    """Each row's first ``lengths[t]`` slots sorted by key (int32 ``[T, K]``), the rest kept."""
    K = rows.shape[1]
    valid = torch.arange(K, device=rows.device)[None, :] < lengths[:, None]
    keyed = torch.where(valid, rows, _BIG)
    keyed, _ = keyed.sort(dim=1)
    return torch.where(valid, keyed, rows)


def rotated(rows, lengths, concurrency):
    """:func:`ascending`, then row t rotated left by ``(t mod concurrency) / concurrency`` of
    its valid slots."""
    rows = ascending(rows, lengths)
    T, K = rows.shape
    n = lengths.to(torch.int64).clamp(min=1)[:, None]
    t = torch.arange(T, device=rows.device, dtype=torch.int64)[:, None]
    shift = (t % concurrency) * n // concurrency
    j = torch.arange(K, device=rows.device, dtype=torch.int64)[None, :]
    src = torch.where(j < n, (j + shift) % n, j)
    return rows.gather(1, src)


def pivoted(rows, lengths, S, concurrency):
    """fast's own slot order (:func:`fast.dsa.slot_order`: valid keys ascending from a pivot
    at ``(t mod concurrency) / concurrency`` of the row's key range) made before the call."""
    saved, fdsa.ORDER_CONCURRENCY = fdsa.ORDER_CONCURRENCY, concurrency
    try:
        return fdsa.slot_order(rows, lengths, S)[0]
    finally:
        fdsa.ORDER_CONCURRENCY = saved


def descending(rows, lengths):
    """Each row's valid slots sorted by key, largest first."""
    K = rows.shape[1]
    valid = torch.arange(K, device=rows.device)[None, :] < lengths[:, None]
    keyed = torch.where(valid, rows, -1)
    keyed, _ = keyed.sort(dim=1, descending=True)
    return torch.where(valid, keyed, rows)


def orderings(rows, lengths, S, concurrencies):
    """(name, rows, fast's slot order setting) of every run."""
    yield "given", rows, "off"
    yield "ascending", ascending(rows, lengths), "off"
    for n in concurrencies:
        yield f"rotated_{n}", rotated(rows, lengths, n), "off"
        yield f"pivoted_{n}", pivoted(rows, lengths, S, n), "off"
    yield "descending", descending(rows, lengths), "off"
    for setting in ("backward", "on"):
        yield f"fast_{setting}", rows, setting


def same_keys(a, b):
    """Whether two rows of :func:`fast.dsa.slot_order` (-1 for no key) hold the same keys."""
    return bool(torch.equal(torch.where(a >= 0, a, _BIG).sort(dim=1).values,
                            torch.where(b >= 0, b, _BIG).sort(dim=1).values))


def same_slots(a, b, lengths):
    """Whether two orderings hold the same multiset of valid slots per row."""
    return bool(torch.equal(ascending(a, lengths), ascending(b, lengths)))


def measure(p, reps, concurrencies, backward, only=None, warps=None, forms=None):
    xs = leaves(p)
    flop_f, flop_b = FWD_FLOP * p["valid"], BWD_FLOP * p["valid"]
    row = {}
    base_out = base_dq = None
    previous = fdsa.set_slot_order("off")
    for name, rows, setting in orderings(p["rows"], p["lengths"], p["S"], concurrencies):
        if only and name not in only:
            continue
        assert same_slots(rows, p["rows"], p["lengths"]), name
        fdsa.set_slot_order(setting)
        with torch.no_grad():
            out = fast_forward(p, xs, rows=rows)

            def fwd():
                return fast_forward(p, xs, rows=rows)

            q, s = queued_ms(fwd, rep_ms=max(40, 10 * reps)), synced_ms(fwd, reps)
        r = dict(fwd_queued_tflops=tflops(flop_f, q), fwd_synced_tflops=tflops(flop_f, s),
                 fwd_queued_ms=q, fwd_synced_ms=s)
        base_out = out if base_out is None else base_out
        r["out_max_diff"] = float((out.float() - base_out.float()).abs().max())
        if backward:
            graph_out = fast_forward(p, xs, rows=rows)

            def bwd():
                return torch.autograd.grad(graph_out, xs, p["dout"], retain_graph=True)

            dq = bwd()[0]
            q, s = queued_ms(bwd, rep_ms=max(40, 10 * reps)), synced_ms(bwd, reps)
            r.update(bwd_queued_tflops=tflops(flop_b, q), bwd_synced_tflops=tflops(flop_b, s),
                     bwd_queued_ms=q, bwd_synced_ms=s)
            base_dq = dq if base_dq is None else base_dq
            r["dq_max_diff"] = float((dq.float() - base_dq.float()).abs().max())
            del graph_out, dq
        row[name] = r
        line = f"{p['name']:>13} {name:>13}: forward {r['fwd_queued_tflops']:6.1f} " \
               f"({r['fwd_synced_tflops']:6.1f}) TFLOP/s queued (synced)"
        if backward:
            line += f", backward {r['bwd_queued_tflops']:6.1f} ({r['bwd_synced_tflops']:6.1f})"
        print(line + f"; out max diff {r['out_max_diff']:.2e}", flush=True)
    fdsa.set_slot_order(previous)
    timed = [("slot_order", lambda: fdsa.slot_order(p["rows"], p["lengths"], p["S"])),
             ("torch_sort", lambda: ascending(p["rows"], p["lengths"]))]
    launches = [(f"{w}warps", dict(num_warps=w)) for w in warps or ()]
    launches += [(f, dict(form=f)) for f in forms or ()]
    want = fdsa.slot_order(p["rows"], p["lengths"], p["S"]) if launches else None
    for what, kwargs in launches:
        def order(kwargs=kwargs):
            return fdsa.slot_order(p["rows"], p["lengths"], p["S"], **kwargs)
        got = order()
        if kwargs.get("form") == "runs":  # another order: the same valid keys a row
            assert same_keys(got[0], want[0]), f"{what}: other keys"
        else:
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{what}: rows differ"
        timed.append((f"slot_order_{what}", order))
    for what, fn in timed:
        row[f"{what}_ms"] = dict(queued=queued_ms(fn), synced=synced_ms(fn, reps))
        print(f"{p['name']:>13} {what}: {row[f'{what}_ms']['queued']:.3f} ms queued, "
              f"{row[f'{what}_ms']['synced']:.3f} synced", flush=True)
    return row


def run_under(forward_form, backward_form, round_, run):
    """``run()`` with the forward's rows ordered in one form and the backward's in another."""
    print(f"round {round_}: forward form {forward_form}, backward form {backward_form}",
          flush=True)
    previous = (fdsa.set_slot_order_form(forward_form),
                fdsa.set_slot_order_form(backward_form, step="backward"))
    try:
        return run()
    finally:
        fdsa.set_slot_order_form(previous[0])
        fdsa.set_slot_order_form(previous[1], step="backward")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default="packed_glm_a,doc_16384")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--concurrency", default="132,264",
                    help="programs resident at once for the rotated orders (comma-separated)")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--only", default="", help="these orderings alone (comma-separated names, "
                    "e.g. given,fast_backward)")
    ap.add_argument("--warps", default="", help="the ordering kernel also timed with these "
                    "warps a row (comma-separated)")
    ap.add_argument("--forms", default="", help="the ordering kernel also timed in these forms "
                    "(comma-separated, of fast.dsa.ORDER_FORMS)")
    ap.add_argument("--step-forms", default="", help="comma-separated forward:backward pairs "
                    "of fast.dsa.ORDER_FORMS (e.g. loop:loop,runs:loop): the orderings timed "
                    "under each pair's forms in turn, --rounds times")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    result = dict(settings=fast_settings(), device=torch.cuda.get_device_name(), problems={})
    pairs = [tuple(pair.split(":")) for pair in args.step_forms.split(",") if pair]
    only = [o for o in args.only.split(",") if o]
    warps = [int(w) for w in args.warps.split(",") if w]
    forms = [f for f in args.forms.split(",") if f]
    for name in args.problems.split(","):
        p = named_problem(name, gen)

        def run(p=p):
            return measure(p, args.reps, concurrencies, args.backward, only, warps, forms)
        if not pairs:
            result["problems"][name] = run()
        else:
            result["problems"][name] = [
                dict(round=r, forward_form=f, backward_form=b, row=run_under(f, b, r, run))
                for r in range(1, args.rounds + 1) for f, b in pairs]
        del p
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
