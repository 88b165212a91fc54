"""The suite's own tests of its controls floor."""
