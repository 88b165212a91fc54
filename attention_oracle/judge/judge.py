"""The judge of one check on one case of one target: every verdict a check reaches goes through it.

A :class:`Judge` carries what every failure message names (the check, the implementation, the
case, its dtype and the command that replays it), so that a check states only what it compares:
``judge.agrees("dq", dq, gold, lp, magnitude=m, gradient=True)``. Its methods are the agreement
module's :func:`~attention_oracle.judge.agreement.assert_agrees`,
``assert_exact``, ``assert_true`` and ``noted``: the same rule, the same OracleMismatch, the
same message format (``[check] implementation=impl output=name: ...\\n  reproduce: ...``).

A registered check (``registry.declare``) builds one judge per call, ``check(target, case)``;
a check that runs on a derived case (``misaligned_inputs`` re-lays the drawn one out) judges
it with ``judge.for_case(derived)``, so that the replay command names the case that failed.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from attention_oracle.judge import agreement, known


@dataclasses.dataclass(frozen=True)
class Judge:
    """``check``: the reported name ``area.check``; ``target``: the implementation under test
    (a :class:`~attention_oracle.judge.targets.Target`); ``case``: the Case judged."""

    check: str
    target: object
    case: object

    @property
    def impl(self) -> str:
        return self.target.name

    @property
    def dtype(self) -> torch.dtype:
        return self.case.torch_dtype

    @property
    def repro(self) -> str:
        """The command that replays this case of this check on this implementation."""
        return self.case.repro(self.check, self.impl)

    def for_case(self, case) -> Judge:
        """The judge of a case derived from this one (same check and target)."""
        return dataclasses.replace(self, case=case)

    def agrees(self, name: str, x: torch.Tensor, gold: torch.Tensor, lp, *, magnitude: float,
               gradient: bool, acc_magnitude: float = 0.0, apriori: float = 0.0) -> agreement.Verdict:
        """The agreement rule on output ``name``: ``x`` against the float64 ``gold`` with the lp
        runs ``lp`` (one tensor or {algorithm: tensor}) in the case's dtype; the Verdict.
        ``magnitude`` / ``acc_magnitude``: the floor's terms (the oracle's ``magnitude`` and
        ``magnitude_acc`` of the output); ``apriori``: the oracle's a-priori term (0: none)."""
        return known.judged(self, name, lambda: agreement.assert_agrees(
            x, gold, lp, check=self.check, impl=self.impl, name=name, dtype=self.dtype,
            gradient=gradient, magnitude=magnitude, repro=self.repro, acc_magnitude=acc_magnitude,
            apriori=apriori))

    def agrees_with(self, name: str, x: torch.Tensor, gold: Mapping, lp: Mapping, *,
                    gradient: bool, select=None, label: str | None = None) -> agreement.Verdict:
        """:meth:`agrees` against the oracle's result dicts: ``gold`` = {output: tensor,
        "magnitude": {output: float}, "magnitude_acc": {gradient: float}}, ``lp`` = {algorithm: {output: tensor}}; ``select``
        indexes x, gold and lp alike (a boolean row mask, say). ``label``: the output's name in
        the verdict and for known signatures (default ``name``, the key into the dicts)."""
        label = name if label is None else label
        def attempt(x=x, gold=gold, lp=lp, select=select):
            g, runs = gold[name], {a: r[name] for a, r in lp.items()}
            if select is not None:
                x, g, runs = x[select], g[select], {a: t[select] for a, t in runs.items()}
            return agreement.assert_agrees(
                x, g, runs, check=self.check, impl=self.impl, name=label, dtype=self.dtype,
                gradient=gradient, magnitude=gold["magnitude"][name], repro=self.repro,
                acc_magnitude=gold.get("magnitude_acc", {}).get(name, 0.0),
                apriori=gold.get("apriori", {}).get(name, 0.0))

        def outside(excuse):  # the same judgment on the elements a known signature leaves
            if excuse.query_rows():
                keep = ~excuse.elements(x)
                if select is not None:
                    if tuple(select.shape) != tuple(keep.shape):
                        raise agreement.OracleMismatch(f"{label}: a selection and a signature at once")
                    keep = keep & select.to(keep.device)
                return attempt(select=keep)
            grads, gold2, lp2 = excuse.rerun()  # key-side: the rows' dout set to zero
            return attempt(x=grads[name], gold=gold2, lp=lp2)

        return known.judged(self, label, attempt, outside if select is None or
                            select.dtype == torch.bool else None)

    def exact(self, name: str, x: torch.Tensor, expected: torch.Tensor, what: str = "",
              select: torch.Tensor | None = None) -> None:
        """Exact equality (NaN equals NaN) of output ``name``; ``what`` says what is compared.
        ``select``: a boolean mask of x's shape, the elements compared (a known signature's
        elements are then mapped onto the whole output, as for :meth:`agrees_with`)."""
        def attempt(keep=None):
            if select is not None:
                keep = select if keep is None else keep & select.to(keep.device)
            a, b = (x, expected) if keep is None else (x[keep], expected.to(x.device)[keep])
            agreement.assert_exact(a, b, check=self.check, impl=self.impl, name=name,
                                   repro=self.repro, what=what)

        known.judged(self, name, attempt, lambda excuse: attempt(~excuse.elements(x)))

    def true(self, name: str, cond: bool, message: str) -> None:
        """A plain property of output ``name``; ``message`` says what went wrong."""
        known.judged(self, name, lambda: agreement.assert_true(
            cond, check=self.check, impl=self.impl, name=name, message=message, repro=self.repro))

    def close(self, name: str, x: torch.Tensor, y: torch.Tensor, allowed: float, what: str,
              without=None) -> None:
        """``max|x - y| <= allowed``: two results of the implementation that must agree.
        ``without(rows) -> (x, y)``: the same two results with those query rows' dout set to
        zero, for a key-side gradient under a known signature of rows (their contribution
        removed, as the Judge's rerun does for agreement)."""
        def attempt(a=x, b=y, keep=None):
            gap = max_gap(a, b) if keep is None else max_gap(a[keep], b[keep])
            agreement.assert_true(gap <= allowed, check=self.check, impl=self.impl, name=name,
                                  message=f"{what}: differ by {gap:.3e} > allowed {allowed:.3e}",
                                  repro=self.repro)

        def outside(excuse):
            if excuse.query_rows() or without is None:
                return attempt(keep=~excuse.elements(x))
            return attempt(*without(excuse.rows()))

        known.judged(self, name, attempt, outside)

    @staticmethod
    def noted(note: str):
        """A context that adds ``note`` to an OracleMismatch raised inside it."""
        return agreement.noted(note)


def max_gap(x: torch.Tensor, y: torch.Tensor) -> float:
    """max|x - y| in float64 (0 for empty tensors)."""
    return float((x.detach().double() - y.detach().double()).abs().max()) if x.numel() else 0.0
