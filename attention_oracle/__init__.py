"""attention-oracle: the verification suite for attention kernels.

Subpackages: ``oracle`` (float64 references), ``fast`` (Triton kernels), ``properties``
(strategies, checks and the harness), ``fixtures`` (named cases and the regression corpus),
``controls`` (deliberately broken implementations the checks must catch) and ``conformance``
(the pytest modules that judge an implementation). ``attention-oracle check --impl NAME``
runs the conformance suite from anywhere.
"""
__version__ = "0.2.0"
