"""Inputs beyond the contract: a clear refusal is a right answer, a wrong result is not.

For an input the contract does not promise (an index dtype other than int32, a layout it
does not name, ``softmax_scale=None`` where no default is declared) an implementation passes
if it computes the right result, or if it raises ``TypeError``, ``ValueError`` or
``NotImplementedError`` whose message names the argument. It fails on a wrong result, on
any other exception, or on an error that does not say which argument it refuses. Where the
implementation *declares* it supports the input, only the right result passes.
"""
from __future__ import annotations

from attention_oracle.judge.targets import ContractViolation, Refused

CLEAR_ERRORS = (TypeError, ValueError, NotImplementedError)


class Declined(Exception):
    """The implementation refused a beyond-contract input clearly (a passing outcome)."""


def attempt(thunk, *, argument: str, what: str, declared: bool, judge):
    """``thunk()``'s result, or raise :class:`Declined` when it refused clearly; fail otherwise
    (through ``judge``, the check's :class:`~attention_oracle.judge.judge.Judge`)."""
    try:
        return thunk()
    except ContractViolation:
        raise
    except Refused as exc:
        err = exc.__cause__ or exc
    except CLEAR_ERRORS as exc:
        err = exc
    except Exception as exc:  # noqa: BLE001 (any other exception is the failure reported)
        judge.true(argument, False,
                   f"{what} (beyond the contract): raised {type(exc).__name__}: {exc}; a "
                   f"right result or a TypeError/ValueError/NotImplementedError naming "
                   f"{argument!r} is expected")
    text = f"{type(err).__name__}: {err}"
    judge.true(argument, not declared, f"{what}: declared supported (capabilities) but raised {text}")
    judge.true(argument, argument in str(err),
               f"{what}: the error does not name the argument {argument!r}: {text}")
    raise Declined(text)
