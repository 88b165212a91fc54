"""Hypothesis strategies, layouts, the agreement rule and the checks."""
