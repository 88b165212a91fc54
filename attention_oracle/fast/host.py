"""Host-side integer helpers for the launchers.

Plain Python on purpose: ``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr
functions whose call wrapper costs a few microseconds per call on the host, and a launch
computes several of them.
"""


def cdiv(a, b):
    """ceil(a / b) for non-negative ints."""
    return -(-a // b)


def next_pow2(n):
    """Smallest power of two >= n (1 for n <= 1)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
