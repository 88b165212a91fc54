"""Autograd guards shared by fast's operations: gradients that refuse a second derivative, and
negative-bit views resolved before a kernel reads their storage."""
import torch


class _FirstOrderOnly(torch.autograd.Function):
    """The identity on the gradients (the first ``n`` tensors), tied to what they depend on (the
    rest), with a backward that refuses, naming the operation ``op``."""

    @staticmethod
    def forward(ctx, op, n, *tensors):
        ctx.op = op
        return tensors[:n]

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            f"{ctx.op}: trying to differentiate twice: its backward kernels compute no second "
            "derivatives (gradients taken with create_graph=True cannot be differentiated again)")


def first_order_only(op, grads, depends_on):
    """The kernels' gradients do not require grad, so under create_graph=True they would enter
    the graph as constants and a loss built on them (a gradient penalty) would lose its share
    silently; tied by :class:`_FirstOrderOnly` to ``depends_on`` (what leads back to the
    inputs, and dout), differentiating them raises instead, naming ``op`` (docs/FINDINGS.md
    F41, F51). Nothing to tie where nothing requires grad."""
    deps = [x for x in depends_on if x is not None and x.requires_grad]
    if not deps:
        return grads
    present = [g for g in grads if g is not None]
    tied = iter(_FirstOrderOnly.apply(op, len(present), *present, *deps))
    return tuple(None if g is None else next(tied) for g in grads)


def resolved_neg(*tensors):
    """The tensors with PyTorch's negative bit resolved (copies; autograd passes gradients
    through): a negative-bit view (the imaginary part of a conjugated complex tensor, say)
    keeps ``x`` in its storage and reads as ``-x``, while the kernels read the storage
    (docs/FINDINGS.md F46, F53). None stays None; a tensor without the bit is returned as is."""
    return tuple(None if t is None else t.resolve_neg() for t in tensors)
