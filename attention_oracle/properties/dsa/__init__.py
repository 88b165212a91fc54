"""DSA sparse attention: cases (what Hypothesis draws) and checks."""
