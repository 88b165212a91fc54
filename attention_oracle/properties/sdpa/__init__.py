"""SDPA: cases (what Hypothesis draws) and checks."""
