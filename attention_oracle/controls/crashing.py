"""A correct SDPA that kills its process with SIGSEGV on one class of inputs (a native crash
inside a kernel, as a segfault in a vendor library is).

``scaled_dot_product_attention`` is the oracle's, except that when ``value`` has more rows than
``key`` (key ``[.., S, E]``, value ``[.., S', Ev]`` with ``S' > S``: the inputs of
``sdpa.mismatched_value_rows``) it sends SIGSEGV to its own process, so no Python exception,
no pytest report and no teardown happen. A run of the suite against it must fail that one test,
name the signal and the case, and finish every other test with a report::

    attention-oracle check --impl attention_oracle.controls.crashing -n 2
"""
from __future__ import annotations

import os
import signal
import sys

from attention_oracle import oracle


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """The oracle's SDPA; a segfault of this process when value has more rows than key."""
    if value.dim() >= 2 and key.dim() >= 2 and value.shape[-2] > key.shape[-2]:
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    return oracle.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                               is_causal, scale, enable_gqa)
